//! `ch-img` on NBD URIs (QEMU's spellings), against qemu-nbd and nbdkit:
//! `info`, `map`, `convert`, `compare` and `bench` answer as qemu-img
//! does on the same URI; `check`, `create -f qcow2` and `convert` to an
//! export without `-n` are refused; a refused export name ends the
//! handshake with NBD_OPT_ABORT (our daemon logs no warning). Every
//! command runs under `timeout`. ch_img_nbd_verbs.rs holds every verb
//! against qemu-img's words.

use std::path::Path;
use std::process::Output;

use integration_tests::{ch_img, json, qemu_img, qemu_io, run, TempDir};
use testkit::nbd_server::{Kind, NbdServer};

/// Runs `program ARGS` with a two-minute deadline.
fn timed(program: &Path, args: &[&str]) -> Output {
    let mut all = vec!["120", program.to_str().unwrap()];
    all.extend_from_slice(args);
    run("timeout", &all)
}

fn ok(program: &Path, args: &[&str]) -> String {
    let out = timed(program, args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program:?} {args:?} ({}): {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn qemu() -> &'static Path {
    Path::new("qemu-img")
}

/// A qcow2 image with data, a zero cluster and holes.
fn image(dir: &TempDir) -> String {
    let img = dir.file("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "32M"]);
    let out = run(
        "qemu-io",
        &[
            "-f",
            "qcow2",
            "-c",
            "write -P 0x5a 1M 2M",
            "-c",
            "write -z 8M 1M",
            "-c",
            "write -P 7 30M 64k",
            &img,
        ],
    );
    assert!(out.status.success());
    img
}

#[test]
fn info_map_convert_compare_and_bench_over_nbd() {
    for kind in [Kind::QemuNbd, Kind::NbdkitFile] {
        if !testkit::has_command(NbdServer::tool(kind)) || !testkit::has_command("qemu-img") {
            return;
        }
        let dir = TempDir::new("ch-img-nbd");
        let src = image(&dir);
        // nbdkit serves raw files: give it the guest view.
        let (served, fmt) = if kind == Kind::NbdkitFile {
            let raw = dir.file("src.raw");
            qemu_img(&["convert", "-O", "raw", &src, &raw]);
            (raw, "raw")
        } else {
            (src.clone(), "qcow2")
        };
        let server = NbdServer::start(
            kind,
            Path::new(&served),
            fmt,
            &dir.path().join("s.sock"),
            false,
        );
        let uri = server.uri.as_str();

        let ours = json(&ok(ch_img(), &["info", "--output=json", uri]));
        let theirs = json(&ok(qemu(), &["info", "--output=json", uri]));
        for key in ["virtual-size", "format"] {
            assert_eq!(ours[key], theirs[key], "{kind:?} info {key}");
        }
        let human = ok(ch_img(), &["info", uri]);
        assert!(
            human.contains("file format: raw") && human.contains("virtual size: 32 MiB"),
            "{human}"
        );

        let ours = ok(ch_img(), &["map", "--output=json", uri]);
        let theirs = ok(qemu(), &["map", "--output=json", uri]);
        assert_eq!(json(&ours), json(&theirs), "{kind:?} map");

        let out = dir.file("out.qcow2");
        ok(ch_img(), &["convert", "-O", "qcow2", uri, &out]);
        ok(qemu(), &["compare", "-U", &out, &src]);
        let chk = ok(qemu(), &["check", &out]);
        assert!(chk.contains("No errors"), "{chk}");

        let copy = dir.file("copy.raw");
        qemu_img(&["convert", "-U", "-O", "raw", &src, &copy]);
        ok(ch_img(), &["compare", uri, &copy]);
        let out = run("qemu-io", &["-f", "raw", "-c", "write -P 1 5M 512", &copy]);
        assert!(out.status.success());
        let differ = timed(ch_img(), &["compare", uri, &copy]);
        assert_eq!(differ.status.code(), Some(1), "compare of different images");

        let bench = ok(
            ch_img(),
            &["bench", "-c", "2000", "-d", "32", "-f", "raw", uri],
        );
        assert!(bench.contains("Run completed"), "{bench}");
        drop(server);
    }
}

#[test]
fn bench_writes_convert_fills_and_what_an_export_cannot_do_is_refused() {
    let kind = Kind::NbdkitMemory;
    if !testkit::has_command(NbdServer::tool(kind)) {
        return;
    }
    let dir = TempDir::new("ch-img-nbd-w");
    let server = NbdServer::start(
        kind,
        Path::new("-"),
        "raw",
        &dir.path().join("m.sock"),
        true,
    );
    let uri = server.uri.as_str();
    let bench = ok(
        ch_img(),
        &["bench", "-w", "-c", "2000", "-d", "16", "-f", "raw", uri],
    );
    assert!(bench.contains("Run completed"), "{bench}");

    let check = timed(ch_img(), &["check", uri]);
    assert_eq!(check.status.code(), Some(63), "check exit");
    assert!(String::from_utf8_lossy(&check.stderr).contains("does not support checks"));
    let create = timed(ch_img(), &["create", "-f", "qcow2", uri, "1M"]);
    assert!(!create.status.success());
    assert!(String::from_utf8_lossy(&create.stderr).contains("NBD export"));
    let local = dir.file("l.raw");
    qemu_img(&["create", "-q", "-f", "raw", &local, "1M"]);
    // Without -n the output is "created" on the export as qemu-img does
    // (its size kept, nothing assumed zero): the zeroes of the source are
    // written over what bench left there.
    let convert = timed(ch_img(), &["convert", "-f", "raw", &local, uri]);
    assert!(convert.status.success(), "{convert:?}");
    qemu_io("raw", uri, &["read -P 0 0 1M"]);
    // With -n the export is written like any existing output.
    qemu_io("raw", &local, &["write -P 0x5c 64k 128k"]);
    let into = timed(
        ch_img(),
        &["convert", "-n", "-f", "raw", "-O", "raw", &local, uri],
    );
    assert!(into.status.success(), "{into:?}");
    // The export's first MiB now holds the local image (bench wrote past it).
    qemu_io(
        "raw",
        uri,
        &[
            "read -P 0 0 64k",
            "read -P 0x5c 64k 128k",
            "read -P 0 192k 832k",
        ],
    );
    let missing = dir.path().join("none.sock");
    let gone = timed(
        ch_img(),
        &[
            "info",
            &format!("nbd+unix:///?socket={}", missing.display()),
        ],
    );
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("Failed to connect to"),
        "{gone:?}"
    );
}

#[test]
fn a_refused_export_name_ends_the_handshake_politely() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let dir = TempDir::new("ch-img-nbd-abort");
    let img = dir.file("d.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "1M"]);
    let sock = dir.path().join("d.sock");
    let log = dir.path().join("daemon.log");
    let daemon = Command::new(integration_tests::project_bin(
        "storage-daemon",
        "ch-storage-daemon",
    ))
    .args(["-v", "--image", &format!("path={img}"), "--export"])
    .arg(format!("type=nbd,addr=unix:{},name=disk", sock.display()))
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let mut daemon = testkit::ChildGuard(daemon);
    let start = Instant::now();
    // Ready once it says so (a probing connection would be a client
    // that hangs up, which the daemon rightly warns of).
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("nbd export 'disk' on")
    {
        assert!(start.elapsed() < Duration::from_secs(30), "no export");
        std::thread::sleep(Duration::from_millis(50));
    }
    let uri = |name: &str| format!("nbd+unix:///{name}?socket={}", sock.display());
    let wrong = timed(ch_img(), &["info", &uri("nope")]);
    assert_eq!(wrong.status.code(), Some(1));
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        err.contains("no export named 'nope'") && err.matches("nbd+unix://").count() == 1,
        "{err}"
    );
    ok(ch_img(), &["info", &uri("disk")]);
    testkit::signal(daemon.id(), "TERM").unwrap();
    testkit::exit_within(&mut daemon, "ch-storage-daemon", Duration::from_secs(30));
    let said = std::fs::read_to_string(&log).unwrap();
    // The client sent NBD_OPT_ABORT: no hang-up for the server to warn of.
    assert!(said.contains("ended the handshake"), "{said}");
    assert!(!said.contains("WARN"), "{said}");
}
