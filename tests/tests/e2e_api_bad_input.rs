//! End-to-end: bad and hostile API clients while the guest does I/O. Each
//! malformed request gets a clear status and body; slow, silent, too many
//! and vanishing clients cost only their own connection; and the guest's
//! I/O, running all along, completes with nothing lost.

mod e2e_api_support;
mod e2e_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use e2e_api_support::{curl_raw, have_curl, ApiVm};
use integration_tests::{json, qemu_img, qemu_io, TempDir};

/// Sends `raw` bytes and reads the answer's status line (with a deadline).
fn raw_exchange(socket: &str, raw: &[u8]) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or_default().to_string()
}

#[test]
fn bad_clients_get_errors_and_the_guest_loses_nothing() {
    if !have_curl() {
        return;
    }
    let dir = TempDir::new("api-bad");
    let img = dir.file("d.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    let rounds = 60u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("disks=1 io_rounds={rounds} park"),
        &["--disk", &format!("path={img},num_queues=2")],
    );
    vm.wait_for("ok   round 2\n");

    // Malformed, unknown, wrong: each refused with its status and a
    // message that says why.
    for (method, endpoint, body, status, word) in [
        ("PUT", "vm.resize-disk", Some("{"), 400, "parse"),
        ("PUT", "vm.resize-disk", Some("not json"), 400, "parse"),
        (
            "PUT",
            "vm.resize-disk",
            Some(r#"{"id":"_disk0"}"#),
            400,
            "desired_size",
        ),
        (
            "PUT",
            "vm.resize-disk",
            Some(r#"{"id":"_disk0","desired_size":"big"}"#),
            400,
            "u64",
        ),
        (
            "PUT",
            "vm.resize-disk",
            Some(r#"{"id":"_disk0","desired_size":-5}"#),
            400,
            "-5",
        ),
        // Unknown fields are ignored (and logged), as upstream does.
        (
            "PUT",
            "vm.resize-disk",
            Some(r#"{"id":"ghost","desired_size":1048576,"x_bogus":1}"#),
            404,
            "ghost",
        ),
        (
            "PUT",
            "vm.resize-disk",
            Some(r#"{"id":"nope","desired_size":1048576}"#),
            404,
            "nope",
        ),
        (
            "PUT",
            "vm.resize-disk",
            Some(r#"{"id":"_disk0","desired_size":4096}"#),
            400,
            "only grow",
        ),
        ("PUT", "vm.resize-disk", None, 400, "body"),
        (
            "PUT",
            "vm.remove-device",
            Some(r#"{"id":"ghost"}"#),
            404,
            "ghost",
        ),
        (
            "PUT",
            "vm.snapshot-disk",
            Some(r#"{"id":"_disk0","name":""}"#),
            400,
            "name",
        ),
        (
            "PUT",
            "vm.snapshot-disk",
            Some(r#"{"id":"_disk0"}"#),
            400,
            "name",
        ),
        ("PUT", "vm.disk-info", Some(r#"{"id":7}"#), 400, "string"),
        ("GET", "vm.nothing", None, 404, "vm.nothing"),
        ("PUT", "vm.info", None, 405, "GET"),
        ("GET", "vm.pause", None, 405, "PUT"),
        ("PUT", "vm.pause", Some("{}"), 400, "no body"),
        // The command line's VM exists: created and booted already.
        (
            "PUT",
            "vm.create",
            Some(r#"{"payload":{"kernel":"/k"}}"#),
            500,
            "already created",
        ),
        ("PUT", "vm.boot", None, 500, "already booted"),
        // A body of the wrong shape never reaches the handler.
        (
            "PUT",
            "vm.create",
            Some(r#"{"cpus":{"boot_vcpus":"two"}}"#),
            400,
            "cpus.boot_vcpus",
        ),
        (
            "PUT",
            "vm.create",
            Some(r#"{"disks":{"path":"/x"}}"#),
            400,
            "disks",
        ),
        ("PUT", "vm.boot", Some("{}"), 400, "no body"),
    ] {
        let (got, text) = vm.curl(method, endpoint, body);
        assert_eq!(got, status, "{method} {endpoint} {body:?}: {text}");
        assert!(text.contains(word), "{method} {endpoint} {body:?}: {text}");
        let list: Vec<String> = serde_json::from_str(&text).expect("a JSON list of messages");
        assert!(!list.is_empty());
    }
    let (got, _) = curl_raw(&vm.socket, "GET", "http://localhost/other/vm.info", None);
    assert_eq!(got, 404);

    // A huge body is refused without being read.
    let huge = format!(r#"{{"id":"_disk0","name":"{}"}}"#, "a".repeat(1 << 20));
    let path = dir.file("huge.json");
    std::fs::write(&path, &huge).unwrap();
    let (got, text) = vm.curl("PUT", "vm.snapshot-disk", Some(&format!("@{path}")));
    assert_eq!(got, 413, "{text}");
    // Not HTTP at all, HTTP/1.0, a chunked body.
    assert!(raw_exchange(&vm.socket, b"hello\r\n\r\n").contains("400"));
    assert!(raw_exchange(&vm.socket, b"GET /api/v1/vm.info HTTP/1.0\r\n\r\n").contains("505"));
    assert!(raw_exchange(
        &vm.socket,
        b"PUT /api/v1/vm.pause HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    .contains("411"));

    // A client that leaves mid-request, and one that says nothing: the
    // others are served meanwhile, at once.
    {
        let mut s = UnixStream::connect(&vm.socket).unwrap();
        s.write_all(b"PUT /api/v1/vm.resize-disk HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"id\"")
            .unwrap();
    }
    let silent: Vec<UnixStream> = (0..3)
        .map(|_| UnixStream::connect(&vm.socket).unwrap())
        .collect();
    let start = Instant::now();
    vm.curl_ok("GET", "vmm.ping", None, 200);
    // Well under the 5 s a silent client may hold its own connection.
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "a silent client stalled the API"
    );
    // Two clients at once, both answered.
    let sock = vm.socket.clone();
    let other = std::thread::spawn(move || {
        (0..5)
            .map(|_| curl_raw(&sock, "GET", "http://localhost/api/v1/vm.counters", None).0)
            .collect::<Vec<_>>()
    });
    for _ in 0..5 {
        vm.curl_ok("GET", "vm.info", None, 200);
    }
    assert!(other.join().unwrap().iter().all(|&s| s == 200));
    // More connections than the server serves at once: the extra ones
    // hear 503 at once, nothing hangs.
    let more: Vec<UnixStream> = (0..8)
        .map(|_| UnixStream::connect(&vm.socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (got, text) = vm.curl("GET", "vmm.ping", None);
    assert_eq!(got, 503, "{text}");
    assert!(text.contains("too many"), "{text}");
    // The silent clients are dropped after the request deadline.
    let mut s = UnixStream::connect(&vm.socket);
    drop(more);
    drop(silent);
    if let Ok(s) = s.as_mut() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (got, _) = vm.curl("GET", "vmm.ping", None);
        if got == 200 {
            break;
        }
        assert!(Instant::now() < end, "the API never recovered ({got})");
        std::thread::sleep(Duration::from_millis(200));
    }

    // All this time the guest did its I/O; it finishes, and every round
    // is on the disk.
    assert!(vm.running());
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    vm.wait_for("RESULT: PASS");
    let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
    assert!(counters["_disk0"]["write_ops"].as_u64().unwrap() >= rounds);
    let (status, stderr) = vm.shutdown();
    assert!(status.success(), "{status}: {stderr}");
    assert!(
        stderr.contains("vm.resize-disk: ignored unknown field(s) x_bogus"),
        "{stderr}"
    );
    let cmds: Vec<String> = (0..rounds)
        .map(|r| format!("read -P {} {} 4k", 0x20 + r, (8 << 20) + r * 4096))
        .collect();
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io("qcow2", &img, &cmds);
    e2e_support::check_clean(&img);
}

#[test]
fn a_socket_path_in_use_or_not_a_socket_is_refused() {
    let dir = TempDir::new("api-sock-bad");
    let file = dir.file("plain");
    std::fs::write(&file, b"x").unwrap();
    let out = testkit::output_within(
        std::process::Command::new(e2e_support::vmm_binary()).args([
            "--kernel",
            "/nonexistent",
            "--api-socket",
            &format!("path={file}"),
        ]),
        testkit::COMMAND_LIMIT,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x", "the file was changed");
    let out = testkit::output_within(
        std::process::Command::new(e2e_support::vmm_binary()).args([
            "--kernel",
            "k",
            "--api-socket",
            "fd=1,path=/x",
        ]),
        testkit::COMMAND_LIMIT,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("api-socket"));
}
