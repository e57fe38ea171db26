//! Every ch-img verb on an NBD URI against qemu-img 7.2's answer on the
//! same export (qemu-storage-daemon serving a raw file): what works
//! works the same,
//! what an export cannot do is refused with qemu-img's words and exit
//! status (`resize`: "Cannot resize NBD nodes", `snapshot`, `rebase -u`,
//! `commit`, `amend`, `check`, `bitmap`, `create` and `dd` past the
//! export's end, `convert -l`), and `info` names the export as qemu-img
//! does, in every spelling (QEMU's older `nbd:unix:PATH:exportname=NAME`
//! included). Every command runs under a deadline (`integration_tests`).

mod ch_img_support;

use std::path::Path;

use ch_img_support::{ch_run, qemu_run, Run};
use integration_tests::{qemu_img, qemu_io, TempDir};
use testkit::nbd_server::{Kind, NbdServer};

const SIZE: &str = "8M";

/// qemu-storage-daemon serving a raw file of [`SIZE`] with some data,
/// writable, as export `disk` (many clients at once: `compare` opens
/// the export twice).
fn serve(dir: &TempDir) -> (NbdServer, String) {
    let raw = dir.file("served.raw");
    qemu_img(&["create", "-q", "-f", "raw", &raw, SIZE]);
    qemu_io("raw", &raw, &["write -P 0x5a 64k 128k"]);
    let server = NbdServer::start(
        Kind::QemuStorageDaemon,
        Path::new(&raw),
        "raw",
        &dir.path().join("s.sock"),
        true,
    );
    (server, raw)
}

/// Both tools' runs of `args` (`{}` is the URI), with `names` replaced
/// in what they print.
fn both(args: &[&str], uri: &str, names: &[(&str, &str)]) -> (Run, Run) {
    let argv: Vec<String> = args.iter().map(|a| a.replace("{}", uri)).collect();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    (qemu_run(&argv, names), ch_run(&argv, names))
}

/// Asserts both tools answer `args` alike (the URI printed as URI).
/// qemu-img's warning that it probed the format is left out: ch-img does
/// not print it, and `snapshot` takes no `-f` in qemu-img 7.2.
fn assert_same(args: &[&str], uri: &str) -> Run {
    let (mut q, c) = both(args, uri, &[(uri, "URI")]);
    q.stderr = q
        .stderr
        .lines()
        .filter(|l| {
            !l.starts_with("WARNING: Image format was not specified") && !l.starts_with("         ")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(q, c, "qemu-img and ch-img differ on {args:?}");
    c
}

#[test]
fn every_verb_answers_as_qemu_img_on_an_export() {
    if !testkit::has_command("qemu-storage-daemon") || !testkit::has_command("qemu-img") {
        return;
    }
    let dir = TempDir::new("ch-img-nbd-verbs");
    let (server, _) = serve(&dir);
    let uri = server.uri.as_str();
    let local = dir.file("local.raw");
    qemu_img(&["create", "-q", "-f", "raw", &local, "1M"]);
    qemu_io("raw", &local, &["write -P 0x33 0 64k"]);
    let big = dir.file("big.raw");
    qemu_img(&["create", "-q", "-f", "raw", &big, "16M"]);
    let out = dir.file("out.raw");

    // What an export cannot do, with qemu-img's reason and status.
    for (args, code, says) in [
        (&["resize", "-f", "raw", "{}", "+1M"][..], 1, "Cannot resize NBD nodes"),
        (&["resize", "-f", "raw", "--shrink", "{}", "4M"], 1, "Cannot resize NBD nodes"),
        (&["commit", "-f", "raw", "{}"], 1, "Image does not have a backing file"),
        (
            &["snapshot", "-c", "s1", "{}"],
            1,
            "Could not create snapshot 's1': -95 (Operation not supported)",
        ),
        (
            &["snapshot", "-a", "s1", "{}"],
            1,
            "Could not apply snapshot 's1': Block driver does not support snapshots",
        ),
        (
            &["snapshot", "-d", "s1", "{}"],
            1,
            "Could not delete snapshot 's1': snapshot not found",
        ),
        (
            &["rebase", "-f", "raw", "-u", "-b", "x", "-F", "raw", "{}"],
            1,
            "Could not change the backing file to 'x': Operation not supported",
        ),
        (
            &["amend", "-f", "raw", "-o", "compat=1.1", "{}"],
            1,
            "Format driver 'raw' does not support option amendment",
        ),
        (&["check", "{}"], 63, "This image format does not support checks"),
        (
            &["bitmap", "-f", "raw", "--remove", "{}", "b0"],
            1,
            "Operation remove on bitmap b0 failed: Dirty bitmap 'b0' not found",
        ),
        (&["create", "-f", "raw", "{}", "16M"], 1, "URI: Cannot grow NBD nodes"),
        (
            &["create", "-f", "raw", "-o", "preallocation=full", "{}", "1M"],
            1,
            "URI: Unsupported preallocation mode 'full'",
        ),
        (
            &["convert", "-l", "s1", "-O", "raw", "{}", &out],
            1,
            "Failed to load snapshot: Block format 'raw' used by device '' does not support temporarily loading internal snapshots",
        ),
    ] {
        let c = assert_same(args, uri);
        assert_eq!(c.code, code, "{args:?}: {c:?}");
        assert!(c.stderr.contains(says), "{args:?}: {c:?}");
        assert!(!c.stderr.contains("unsupported image feature"), "{c:?}");
    }
    assert!(
        !Path::new(&out).exists(),
        "a refused convert left its output"
    );
    let c = assert_same(
        &[
            "dd",
            "-f",
            "raw",
            &format!("if={big}"),
            "of={}",
            "bs=1M",
            "count=16",
        ],
        uri,
    );
    assert_eq!(
        (c.code, c.stderr.as_str()),
        (
            1,
            "TOOL: URI: error while creating output image: Cannot grow NBD nodes\n"
        )
    );

    // qemu-img names its own node (#blockNNN) where we name the export.
    let (q, c) = both(
        &["bitmap", "-f", "raw", "--add", "{}", "b0"],
        uri,
        &[(uri, "URI")],
    );
    assert_eq!((q.code, c.code), (1, 1));
    let node = q
        .stderr
        .split("persistent bitmaps to ")
        .nth(1)
        .and_then(|t| t.split(':').next())
        .unwrap_or_else(|| panic!("{q:?}"));
    assert_eq!(q.stderr.replace(node, "URI"), c.stderr);

    // What works, works the same (and writes the same).
    for args in [
        &["info", "{}"][..],
        &["info", "--output=json", "{}"],
        &["info", "-f", "raw", "--output=json", "{}"],
        &["map", "-f", "raw", "{}"],
        &["map", "--output=json", "{}"],
        &["measure", "-f", "raw", "-O", "qcow2", "{}"],
        &["compare", "-f", "raw", "-F", "raw", "{}", "{}"],
        &["snapshot", "-l", "{}"],
        &["resize", "-f", "raw", "{}", SIZE],
        &["create", "-f", "raw", "{}", "4M"],
        &["convert", "-f", "raw", "-O", "raw", &local, "{}"],
        &["convert", "-n", "-f", "raw", "-O", "raw", &local, "{}"],
        &[
            "dd",
            "-f",
            "raw",
            &format!("if={local}"),
            "of={}",
            "bs=64k",
            "count=2",
        ],
    ] {
        let c = assert_same(args, uri);
        assert_eq!(c.code, 0, "{args:?}: {c:?}");
    }
    // The last commands wrote the local image's first 128 KiB (dd) and
    // the rest of its 1 MiB (convert, then convert -n) over the zeroed
    // first sector.
    qemu_io("raw", uri, &["read -P 0x33 0 64k", "read -P 0 64k 960k"]);

    let json = integration_tests::json(&qemu_img(&["info", "--output=json", uri]));
    assert!(json.get("dirty-flag").is_none() && json.get("actual-size").is_none());
}

#[test]
fn info_names_the_export_as_qemu_img_does_in_every_spelling() {
    for tool in ["qemu-storage-daemon", "qemu-nbd", "qemu-img"] {
        if !testkit::has_command(tool) {
            return;
        }
    }
    let dir = TempDir::new("ch-img-nbd-names");
    let (server, _) = serve(&dir);
    let sock = dir.path().join("s.sock").display().to_string();
    assert_eq!(server.uri, format!("nbd+unix:///disk?socket={sock}"));
    for spelled in [
        server.uri.clone(),
        format!("nbd+unix:///%64isk?socket={sock}"),
        format!("nbd:unix:{sock}:exportname=disk"),
    ] {
        for args in [
            &["info", "{}"][..],
            &["info", "--output=json", "{}"],
            &["map", "{}"],
        ] {
            let (q, c) = both(args, &spelled, &[]);
            assert_eq!(q, c, "{args:?} on {spelled}");
            assert_eq!(c.code, 0, "{c:?}");
            assert!(
                c.stdout
                    .contains(&format!("nbd+unix:///disk?socket={sock}")),
                "{c:?}"
            );
        }
    }
    // The default export and TCP: with and without a port, as QEMU names
    // them (`nbd+unix://?socket=`, `nbd://HOST:PORT`).
    drop(server);
    let raw = dir.file("served.raw");
    let (mut nbd, port) = qemu_nbd_tcp(&raw);
    for (spelled, named) in [
        (
            format!("nbd://127.0.0.1:{port}"),
            format!("nbd://127.0.0.1:{port}"),
        ),
        (
            format!("nbd://127.0.0.1:{port}/"),
            format!("nbd://127.0.0.1:{port}"),
        ),
        (
            format!("nbd+tcp://localhost:{port}/"),
            format!("nbd://localhost:{port}"),
        ),
        (
            format!("nbd:127.0.0.1:{port}"),
            format!("nbd://127.0.0.1:{port}"),
        ),
    ] {
        let (q, c) = both(&["info", "{}"], &spelled, &[]);
        assert_eq!(q, c, "info {spelled}");
        assert!(c.stdout.starts_with(&format!("image: {named}\n")), "{c:?}");
    }
    let _ = nbd.kill();
    let _ = nbd.wait();
}

/// qemu-nbd serving `raw` as the default export on a free TCP port of
/// 127.0.0.1, for many clients, killed when the guard drops; the port.
fn qemu_nbd_tcp(raw: &str) -> (testkit::ChildGuard, u16) {
    use std::process::{Command, Stdio};
    // A port nobody listens on (taken, then released for qemu-nbd).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Run directly (not under timeout(1)): the guard's kill must reach
    // qemu-nbd itself.
    let child = Command::new("qemu-nbd")
        .args(["-t", "-f", "raw", "--shared=8", "-b", "127.0.0.1"])
        .args(["-p", &port.to_string(), raw])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qemu-nbd");
    let start = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "qemu-nbd never listened on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (testkit::ChildGuard(child), port)
}

/// An overlay whose backing file is an export: created with an absolute
/// path (the URI is not resolved against the overlay's folder), and
/// when the server is not there, the same words as qemu-img's.
#[test]
fn an_overlay_over_an_export_answers_as_qemu_img() {
    if !testkit::has_command("qemu-storage-daemon") || !testkit::has_command("qemu-img") {
        return;
    }
    let dir = TempDir::new("ch-img-nbd-overlay");
    let (server, _) = serve(&dir);
    let uri = server.uri.clone();
    let overlay = dir.file("over.qcow2");
    let args = ["create", "-f", "qcow2", "-b", &uri, "-F", "raw", "{}"];
    let (q, c) = both(&args, &overlay, &[(&overlay, "IMG"), (&uri, "URI")]);
    assert_eq!(q, c);
    assert_eq!(c.code, 0, "{c:?}");
    for args in [&["map", "{}"][..], &["info", "--backing-chain", "{}"]] {
        let c = assert_same(args, &overlay);
        assert_eq!(c.code, 0, "{c:?}");
    }
    drop(server);
    for (args, code) in [(&["map", "{}"][..], 1), (&["compare", "{}", "{}"], 2)] {
        let c = assert_same(args, &overlay);
        assert_eq!(c.code, code, "{c:?}");
        assert!(
            c.stderr.starts_with(
                "TOOL: Could not open 'URI': Could not open backing file: Failed to connect to '"
            ),
            "{c:?}"
        );
    }
    let missing = dir.file("missing.qcow2");
    let (q, c) = both(&args, &missing, &[(&missing, "IMG"), (&uri, "URI")]);
    assert_eq!(q, c);
    assert_eq!(c.code, 1, "{c:?}");
}
