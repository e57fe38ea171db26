//! The NBD export against real NBD clients nobody here wrote: qemu-img,
//! qemu-io, nbdinfo, nbdcopy and fio's nbd engine. Reads equal the image,
//! writes verify and leave `qemu-img check` clean, the block status
//! matches the local map, several clients run at once, over a Unix socket
//! and over TCP.

mod nbd_support;

use std::process::Command;

use nbd_support::{free_port, have, run, scratch, sh, try_run, unix_uri, Daemon};

/// A qcow2 image with data, a zero cluster and unallocated ranges.
fn make_qcow2(dir: &std::path::Path) -> String {
    let img = dir.join("img.qcow2");
    let i = img.display();
    sh(&format!(
        "qemu-img create -q -f qcow2 {i} 64M && \
         qemu-io -f qcow2 -c 'write -P 0x5a 1M 3M' -c 'write -P 0x11 20M 64k' \
                 -c 'write -z 30M 1M' -c 'write -P 0x22 63M 1M' {i} >/dev/null"
    ));
    img.display().to_string()
}

#[test]
fn qemu_img_and_nbdcopy_read_the_image() {
    if !have(&["qemu-img", "qemu-io", "nbdcopy", "nbdinfo"]) {
        return;
    }
    let dir = scratch("read");
    let img = make_qcow2(&dir);
    let sock = dir.join("s.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={img},readonly=on"),
        &format!("addr=unix:{},name=disk", sock.display()),
    );
    let uri = unix_uri(&sock, "disk");
    let info = run(Command::new("nbdinfo").arg(&uri));
    assert!(info.contains("export-size: 67108864"), "{info}");
    assert!(info.contains("is_read_only: true"), "{info}");
    assert!(info.contains("can_multi_conn: true"), "{info}");
    let out1 = dir.join("qemu.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &uri])
        .arg(&out1));
    let out2 = dir.join("nbdcopy.raw");
    run(Command::new("nbdcopy")
        .args(["--connections=4", &uri])
        .arg(&out2));
    d.stop();
    for out in [&out1, &out2] {
        run(Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "qcow2"])
            .arg(out)
            .arg(&img));
    }
    let list = {
        let d = Daemon::start(
            &dir,
            &format!("path={img},readonly=on"),
            &format!(
                "addr=unix:{},name=disk,description=the test disk",
                sock.display()
            ),
        );
        let l = run(Command::new("nbdinfo").args(["--list", &unix_uri(&sock, "")]));
        d.stop();
        l
    };
    assert!(
        list.contains("export=\"disk\"") && list.contains("the test disk"),
        "{list}"
    );
}

#[test]
fn qemu_io_writes_verify_and_check_is_clean() {
    if !have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = scratch("write");
    let img = make_qcow2(&dir);
    let reference = dir.join("ref.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-O", "raw", &img])
        .arg(&reference));
    let sock = dir.join("s.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={img}"),
        &format!("addr=unix:{},name=w,writable=on", sock.display()),
    );
    let uri = unix_uri(&sock, "w");
    let cmds = [
        "write -P 0x66 0 8k",
        "write -P 0x67 -f 6M 1M",
        "writev -P 0x68 40M 4k 4k 512",
        "write -z 1M 64k",
        "write -z -u 2M 1M",
        "write -z -f 10M 2M",
        "discard 63M 512k",
        "aio_write -P 0x69 50M 64k",
        "aio_write -P 0x6a 51M 64k",
        "aio_flush",
        "flush",
    ];
    let mut args = vec!["-f".to_string(), "raw".to_string()];
    for c in cmds {
        args.push("-c".into());
        args.push(c.into());
    }
    // Apply the same writes to the reference (discard reads back zeroes
    // from a qcow2 image; on the raw reference write zeroes there).
    run(Command::new("qemu-io").args(&args).arg(&uri));
    let mut ref_args = args.clone();
    let pos = ref_args
        .iter()
        .position(|a| a == "discard 63M 512k")
        .unwrap();
    ref_args[pos] = "write -z 63M 512k".into();
    run(Command::new("qemu-io").args(&ref_args).arg(&reference));
    // Read back through the export.
    let check = run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "read -P 0x66 0 8k",
        "-c",
        "read -P 0x67 6M 1M",
        "-c",
        "read -P 0 1M 64k",
        "-c",
        "read -P 0x5a 3M 1M",
        "-c",
        "read -P 0 63M 512k",
        "-c",
        "read -P 0x6a 51M 64k",
        &uri,
    ]));
    assert!(!check.contains("Pattern verification failed"), "{check}");
    // A FAST_ZERO that would write data is refused, and the image is not
    // touched by it.
    let (_, fast) =
        try_run(Command::new("qemu-io").args(["-f", "raw", "-c", "write -z -u -n 3M 4k", &uri]));
    assert!(
        fast.contains("Operation not supported") || fast.contains("wrote"),
        "{fast}"
    );
    d.stop();
    let chk = run(Command::new("qemu-img").args(["check", &img]));
    assert!(chk.contains("No errors"), "{chk}");
    run(Command::new("qemu-img")
        .args(["compare", "-F", "raw"])
        .arg(&img)
        .arg(&reference));
}

#[test]
fn fio_nbd_engine_verifies_writes_from_several_connections() {
    if !have(&["qemu-img", "fio"]) {
        return;
    }
    let dir = scratch("fio");
    let img = dir.join("f.qcow2");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&img)
        .arg("32M"));
    let sock = dir.join("s.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={}", img.display()),
        &format!("addr=unix:{},writable=on", sock.display()),
    );
    let uri = unix_uri(&sock, "");
    // Two jobs, each on its own connection and its own half of the disk.
    let out = run(Command::new("fio").args([
        "--name=v",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--size=16M",
        "--numjobs=2",
        "--offset_increment=16M",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--do_verify=1",
        "--group_reporting",
    ]));
    assert!(out.contains("err= 0"), "{out}");
    d.stop();
    let chk = run(Command::new("qemu-img").arg("check").arg(&img));
    assert!(chk.contains("No errors"), "{chk}");
}

/// `qemu-img map --output=json` entries reduced to what NBD carries:
/// (start, length, data, zero), neighbours with equal flags merged.
fn data_zero_map(json: &str) -> Vec<(u64, u64, bool, bool)> {
    let mut out: Vec<(u64, u64, bool, bool)> = Vec::new();
    for line in json.lines().filter(|l| l.contains("\"start\"")) {
        let field = |k: &str| -> String {
            let at = line.find(&format!("\"{k}\": ")).unwrap() + k.len() + 4;
            line[at..]
                .split([',', '}'])
                .next()
                .unwrap()
                .trim()
                .to_string()
        };
        let (start, len) = (
            field("start").parse().unwrap(),
            field("length").parse().unwrap(),
        );
        let (data, zero) = (field("data") == "true", field("zero") == "true");
        match out.last_mut() {
            Some(l) if l.2 == data && l.3 == zero && l.0 + l.1 == start => l.1 += len,
            _ => out.push((start, len, data, zero)),
        }
    }
    out
}

#[test]
fn block_status_over_nbd_matches_the_local_map() {
    if !have(&["qemu-img", "qemu-io", "nbdinfo"]) {
        return;
    }
    let dir = scratch("map");
    let img = make_qcow2(&dir);
    let raw = dir.join("sparse.raw");
    sh(&format!(
        "truncate -s 16M {r} && qemu-io -f raw -c 'write -P 1 4M 1M' -c 'write -P 2 9M 4k' {r} >/dev/null",
        r = raw.display()
    ));
    for (image, fmt) in [(img.clone(), "qcow2"), (raw.display().to_string(), "raw")] {
        let local = run(Command::new("qemu-img").args(["map", "--output=json", "-f", fmt, &image]));
        let sock = dir.join(format!("{fmt}.sock"));
        let d = Daemon::start(
            &dir,
            &format!("path={image},readonly=on,image_type={fmt}"),
            &format!("addr=unix:{}", sock.display()),
        );
        let uri = unix_uri(&sock, "");
        let remote =
            run(Command::new("qemu-img").args(["map", "--output=json", "-f", "raw", &uri]));
        assert_eq!(
            data_zero_map(&remote),
            data_zero_map(&local),
            "{fmt}:\n{remote}\nvs\n{local}"
        );
        // nbdinfo --map: "start length flags description" lines.
        let m = run(Command::new("nbdinfo").args(["--map", &uri]));
        let mut from_nbdinfo = Vec::new();
        for l in m.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags: u32 = f[2].parse().unwrap();
            from_nbdinfo.push((
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                flags & 1 == 0,
                flags & 2 != 0,
            ));
        }
        assert_eq!(from_nbdinfo, data_zero_map(&local), "{fmt}: {m}");
        d.stop();
    }
}

#[test]
fn tcp_exports_serve_several_clients_and_max_connections_one_has_no_multi_conn() {
    if !have(&["qemu-img", "nbdinfo", "qemu-io"]) {
        return;
    }
    let dir = scratch("tcp");
    let img = make_qcow2(&dir);
    let port = free_port();
    let d = Daemon::start(
        &dir,
        &format!("path={img}"),
        &format!("addr=tcp:127.0.0.1:{port},name=t,writable=on"),
    );
    let uri = format!("nbd://127.0.0.1:{port}/t");
    let info = run(Command::new("qemu-img").args(["info", "-f", "raw", &uri]));
    assert!(info.contains("virtual size: 64 MiB"), "{info}");
    // Four clients at once, each writing and verifying its own range.
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let uri = uri.clone();
            std::thread::spawn(move || {
                let off = 40 + i * 2;
                run(Command::new("qemu-io").args([
                    "-f",
                    "raw",
                    "-c",
                    &format!("write -P {} {off}M 2M", 0x30 + i),
                    "-c",
                    &format!("read -P {} {off}M 2M", 0x30 + i),
                    &uri,
                ]))
            })
        })
        .collect();
    for c in clients {
        let out = c.join().unwrap();
        assert!(!out.contains("failed"), "{out}");
    }
    d.stop();
    let chk = run(Command::new("qemu-img").args(["check", &img]));
    assert!(chk.contains("No errors"), "{chk}");

    let sock = dir.join("one.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={img},readonly=on"),
        &format!("addr=unix:{},max_connections=1", sock.display()),
    );
    let info = run(Command::new("nbdinfo").arg(unix_uri(&sock, "")));
    assert!(info.contains("can_multi_conn: false"), "{info}");
    d.stop();
}

#[test]
fn start_refuses_what_cannot_work() {
    let dir = scratch("refuse");
    let img = dir.join("r.raw");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let sock = dir.join("taken.sock");
    std::fs::write(&sock, b"").unwrap();
    let i = img.display();
    for (image, export, needle) in [
        (
            format!("path={i}"),
            format!("addr=unix:{}", sock.display()),
            "already exists",
        ),
        (
            format!("path={i},readonly=on"),
            format!("addr=unix:{}.2,writable=on", sock.display()),
            "read-only",
        ),
        (
            format!("path={i}"),
            "addr=tcp:256.1.1.1:1".to_string(),
            "cannot listen",
        ),
    ] {
        let err = match Daemon::try_start(&dir, &image, &export) {
            Err(e) => e,
            Ok(d) => {
                drop(d);
                panic!("{export} started");
            }
        };
        assert!(err.contains(needle), "{export}: {err}");
    }
    assert_eq!(
        std::fs::read(&sock).unwrap(),
        b"",
        "an existing file is never replaced"
    );
}

#[test]
fn the_daemon_exports_an_image_it_reads_from_an_nbd_server() {
    use testkit::nbd_server::{Kind, NbdServer};
    if !have(&["qemu-img", "qemu-io", "nbdkit"]) {
        return;
    }
    let dir = scratch("chain");
    let img = make_qcow2(&dir);
    let raw = dir.join("base.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-O", "raw", &img])
        .arg(&raw));
    let server = NbdServer::start(Kind::NbdkitFile, &raw, "raw", &dir.join("up.sock"), true);
    let sock = dir.join("down.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={},reconnect_delay=5", server.uri),
        &format!("addr=unix:{},writable=on", sock.display()),
    );
    let uri = unix_uri(&sock, "");
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x77 10M 1M",
        "-c",
        "read -P 0x77 10M 1M",
        &uri,
    ]));
    let out = dir.join("out.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &uri])
        .arg(&out));
    d.stop();
    drop(server);
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&out)
        .arg(&raw));
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x77 10M 1M"])
        .arg(&raw));
}
