//! The NBD client against real servers nobody here wrote: qemu-nbd,
//! qemu-storage-daemon's NBD export and nbdkit (file and memory). Many
//! requests in flight, writes split at the server's payload limit,
//! zeroes, trims and flushes; a qcow2 overlay over an NBD backing file;
//! reconnection with QEMU's reconnect-delay semantics and the lines it
//! logs; what an export cannot do (a typed refusal, the asker's mistake);
//! errors that name the URI once.

mod nbd_support;
mod support;

use std::time::{Duration, Instant};

use block::{BlockRequest, Completion, Disk, DiskOptions, DiskQueue, IoMemory, RequestOp};
use nbd_support::{scratch, within};
use testkit::nbd_server::{Kind, NbdServer, ALL};

const SIZE: usize = 64 << 20;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// qemu-img `args`, which must succeed; its stdout and stderr.
fn qemu(args: &[&str]) -> String {
    support::run("qemu-img", args)
}

fn open(uri: &str, extra: &str) -> Disk {
    let mut kv = ch_util::kv::KvList::parse("--disk", &format!("path={uri}{extra}")).unwrap();
    let opts = block::options::take_image_options(&mut kv).unwrap();
    kv.finish().unwrap();
    Disk::open(&opts).unwrap_or_else(|e| panic!("open {uri}: {e}"))
}

/// Submits every request at once and waits for all of them.
fn run_batch(q: &mut DiskQueue, reqs: Vec<BlockRequest>) -> Vec<Completion> {
    let n = reqs.len();
    q.submit_batch_requests(reqs);
    let mut out = Vec::new();
    while out.len() < n {
        support::wait_completions_within(q, &mut out, support::QUEUE_LIMIT);
    }
    out.sort_by_key(|c| c.user_data);
    out
}

fn req(user_data: u64, op: RequestOp, offset: u64, memory: IoMemory) -> BlockRequest {
    BlockRequest {
        user_data,
        op,
        offset,
        memory,
    }
}

/// Writes, zeroes, trims and flushes through `disk`, checking every read
/// against `model`; returns the model.
fn exercise(disk: &Disk, mut model: Vec<u8>) -> Vec<u8> {
    let mut q = disk.queue().unwrap();
    // 64 writes in flight at once, each 16 KiB in its own 256 KiB slot.
    let writes = (0..64u64)
        .map(|i| {
            let data = pattern(i as u8, 16 << 10);
            let off = i * (256 << 10) + 512 * i;
            model[off as usize..off as usize + data.len()].copy_from_slice(&data);
            req(i, RequestOp::Write, off, IoMemory::Owned(data))
        })
        .collect();
    for c in run_batch(&mut q, writes) {
        c.result.unwrap();
    }
    // A write longer than any server's payload limit (split in commands).
    let big = pattern(7, 40 << 20);
    disk.write_at(20 << 20, &big).unwrap();
    model[20 << 20..(20 << 20) + big.len()].copy_from_slice(&big);
    // Zeroes, and a trim that is overwritten again (trimmed bytes read
    // as the server likes).
    disk.write_zeroes(4 << 20, 1 << 20, false).unwrap();
    model[4 << 20..5 << 20].fill(0);
    disk.discard(6 << 20, 1 << 20).unwrap();
    let again = pattern(9, 1 << 20);
    disk.write_at(6 << 20, &again).unwrap();
    model[6 << 20..7 << 20].copy_from_slice(&again);
    disk.flush().unwrap();
    // 128 reads in flight, all over the disk, against the model.
    let reads = (0..128u64)
        .map(|i| {
            let off = (i * 499_712) % (SIZE as u64 - 70_000);
            req(
                i,
                RequestOp::Read,
                off,
                IoMemory::Owned(vec![0xee; 65_536 + 512 * (i as usize % 8)]),
            )
        })
        .collect();
    let offsets: Vec<u64> = (0..128u64)
        .map(|i| (i * 499_712) % (SIZE as u64 - 70_000))
        .collect();
    for c in run_batch(&mut q, reads) {
        let off = offsets[c.user_data as usize] as usize;
        let got = c.memory.into_owned().unwrap();
        c.result.unwrap();
        assert!(got == model[off..off + got.len()], "read at {off} differs");
    }
    let mut whole = vec![0u8; SIZE];
    disk.read_at(0, &mut whole).unwrap();
    assert!(whole == model, "the whole disk differs from the model");
    model
}

#[test]
fn every_server_serves_what_we_write() {
    for kind in ALL {
        if !testkit::has_command(NbdServer::tool(kind)) || !testkit::has_command("qemu-img") {
            return;
        }
        let dir = scratch(&format!("rw-{kind:?}"));
        let (img, fmt) = match kind {
            Kind::QemuNbd | Kind::QemuStorageDaemon => (dir.join("d.qcow2"), "qcow2"),
            _ => (dir.join("d.raw"), "raw"),
        };
        let initial = pattern(1, SIZE);
        let raw = dir.join("initial.raw");
        std::fs::write(&raw, &initial).unwrap();
        qemu(&[
            "convert",
            "-O",
            fmt,
            raw.to_str().unwrap(),
            img.to_str().unwrap(),
        ]);
        let server = NbdServer::start(kind, &img, fmt, &dir.join("s.sock"), true);
        let uri = server.uri.clone();
        let initial = if kind == Kind::NbdkitMemory {
            vec![0; SIZE]
        } else {
            initial
        };
        let model = within(300, move || {
            let disk = open(&uri, "");
            assert_eq!(disk.size(), SIZE as u64);
            let model = exercise(&disk, initial);
            disk.close().unwrap();
            model
        });
        drop(server);
        if kind != Kind::NbdkitMemory {
            std::fs::write(&raw, &model).unwrap();
            qemu(&[
                "compare",
                "-f",
                fmt,
                "-F",
                "raw",
                img.to_str().unwrap(),
                raw.to_str().unwrap(),
            ]);
        }
    }
}

#[test]
fn a_qcow2_overlay_reads_and_copies_on_write_from_an_nbd_backing_file() {
    for kind in [Kind::QemuNbd, Kind::NbdkitFile] {
        if !testkit::has_command(NbdServer::tool(kind)) || !testkit::has_command("qemu-img") {
            return;
        }
        let dir = scratch(&format!("overlay-{kind:?}"));
        let base = dir.join("base.raw");
        let mut model = pattern(3, 16 << 20);
        std::fs::write(&base, &model).unwrap();
        let server = NbdServer::start(kind, &base, "raw", &dir.join("b.sock"), false);
        let ov = dir.join("ov.qcow2");
        let ovs = ov.to_str().unwrap().to_string();
        qemu(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            &server.uri,
            "-F",
            "raw",
            &ovs,
        ]);
        let m = within(120, move || {
            let disk = open(&ovs, "");
            // Partial clusters: copy-on-write reads the rest from NBD.
            for (off, len) in [
                (1000u64, 100usize),
                (65_536 * 3 + 7, 70_000),
                (8 << 20, 4096),
            ] {
                let d = pattern(off as u8, len);
                disk.write_at(off, &d).unwrap();
                model[off as usize..off as usize + len].copy_from_slice(&d);
            }
            let mut got = vec![0u8; model.len()];
            disk.read_at(0, &mut got).unwrap();
            assert!(got == model, "the overlay reads differ");
            let st = disk.format().block_status(12 << 20, 1 << 20).unwrap();
            assert!(st.depth == 1 && st.data, "{st:?}");
            disk.close().unwrap();
            model
        });
        let chk = qemu(&["check", ov.to_str().unwrap()]);
        assert!(chk.contains("No errors"), "{chk}");
        let expect = dir.join("expect.raw");
        std::fs::write(&expect, &m).unwrap();
        qemu(&[
            "compare",
            "-U",
            "-F",
            "raw",
            ov.to_str().unwrap(),
            expect.to_str().unwrap(),
        ]);
        drop(server);
    }
}

#[test]
fn an_overlay_whose_nbd_backing_goes_away_fails_reads_and_stays_clean() {
    let kind = Kind::NbdkitFile;
    if !testkit::has_command(NbdServer::tool(kind)) || !testkit::has_command("qemu-img") {
        return;
    }
    let dir = scratch("overlay-gone");
    let base = dir.join("base.raw");
    std::fs::write(&base, pattern(5, 4 << 20)).unwrap();
    let mut server = NbdServer::start(kind, &base, "raw", &dir.join("b.sock"), false);
    let ov = dir.join("ov.qcow2");
    let ovs = ov.to_str().unwrap().to_string();
    qemu(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        &server.uri,
        "-F",
        "raw",
        &ovs,
    ]);
    let disk = open(&ovs, "");
    disk.write_at(0, &[1u8; 65_536]).unwrap();
    server.kill();
    let d = disk.clone();
    within(60, move || {
        let mut buf = vec![0u8; 4096];
        let e = d.read_at(1 << 20, &mut buf).unwrap_err();
        assert!(e.to_string().contains("read failed"), "{e}");
        // A partial-cluster write needs the backing data: it fails, and
        // changes nothing.
        assert!(d.write_at((2 << 20) + 100, &[2u8; 100]).is_err());
        // Whole clusters and allocated ones still work.
        d.write_at(0, &[3u8; 512]).unwrap();
        d.write_at(3 << 20, &[4u8; 65_536]).unwrap();
        d.close().unwrap();
    });
    drop(disk);
    server.restart();
    let chk = qemu(&["check", &ovs]);
    assert!(chk.contains("No errors"), "{chk}");
}

fn read_one(q: &mut DiskQueue, off: u64) -> Result<Vec<u8>, block::BlockError> {
    let c = run_batch(
        q,
        vec![req(0, RequestOp::Read, off, IoMemory::Owned(vec![0; 4096]))],
    )
    .remove(0);
    c.result.map(|_| c.memory.into_owned().unwrap())
}

#[test]
fn requests_wait_for_a_reconnection_within_the_reconnect_delay() {
    let kind = Kind::QemuStorageDaemon;
    if !testkit::has_command(NbdServer::tool(kind)) {
        return;
    }
    nbd_support::captured_log::install();
    let dir = scratch("reconnect");
    let img = dir.join("r.raw");
    let data = pattern(8, 8 << 20);
    std::fs::write(&img, &data).unwrap();
    let sock = dir.join("r.sock");
    let mut server = NbdServer::start(kind, &img, "raw", &sock, true);
    let uri = server.uri.clone();
    // What the client logged about this export (tests run in parallel).
    let sock_name = sock.to_string_lossy().into_owned();
    let ours = move |needle: &str| {
        nbd_support::captured_log::lines_with(needle)
            .into_iter()
            .filter(|l| l.contains(&sock_name))
            .collect::<Vec<_>>()
    };
    let disk = open(&uri, ",reconnect_delay=20");
    let mut q = disk.queue().unwrap();
    assert_eq!(read_one(&mut q, 0).unwrap(), &data[..4096]);
    server.kill();
    // The read waits for the server, which comes back after a second.
    let reader = std::thread::spawn(move || {
        let t = Instant::now();
        (read_one(&mut q, 8192), t.elapsed())
    });
    std::thread::sleep(Duration::from_secs(1));
    server.restart();
    let (r, waited) = within(60, move || reader.join().unwrap());
    assert_eq!(r.unwrap(), &data[8192..8192 + 4096]);
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    // The operator sees each connection's loss and return (a multi-conn
    // server: the first connection and the queue's own), with how long
    // the export was away.
    // The connection the read did not use comes back on its own
    // schedule (1, 2, 4 s ... after the loss).
    let back = within(60, {
        let ours = ours.clone();
        move || loop {
            let (lost, back) = (ours("connection lost"), ours("reconnected after"));
            if !lost.is_empty() && back.len() == lost.len() {
                return back;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    assert!(
        back[0].starts_with("WARN: ")
            && back[0].contains(" s away")
            && back[0].contains("sent again"),
        "{back:?}"
    );
    let away: f64 = back[0]
        .split("reconnected after ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {back:?}"));
    assert!((0.5..30.0).contains(&away), "{back:?}");
    drop(disk);

    // Without a delay requests fail at once; the client reconnects in
    // the background and later requests work again.
    let disk = open(&uri, "");
    let mut q = disk.queue().unwrap();
    let attempts_before = ours("reconnect attempt").len();
    server.kill();
    // The first request may still be answered by the dying connection.
    let failed = within(30, move || {
        let t = Instant::now();
        let r = read_one(&mut q, 0);
        (r.is_err(), t.elapsed(), q)
    });
    let (is_err, took, mut q) = failed;
    assert!(is_err && took < Duration::from_secs(5), "{took:?}");
    // The first attempt (at once) finds no server, or one that is going
    // away; it is logged with why.
    let failed = within(30, {
        let ours = ours.clone();
        move || loop {
            let lines = ours("reconnect attempt");
            if lines.len() > attempts_before {
                return lines[attempts_before].clone();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    assert!(
        failed.starts_with("WARN: ")
            && failed.contains("reconnect attempt 1 failed")
            && (failed.contains("Failed to connect to")
                || failed.contains("the server closed the connection")),
        "{failed}"
    );
    server.restart();
    let back = within(60, move || {
        let t = Instant::now();
        loop {
            if let Ok(b) = read_one(&mut q, 0) {
                return b;
            }
            assert!(t.elapsed() < Duration::from_secs(40), "never reconnected");
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    assert_eq!(back, &data[..4096]);
    drop(disk);

    // A delay that runs out fails the waiting requests.
    let disk = open(&uri, ",reconnect_delay=2");
    let mut q = disk.queue().unwrap();
    server.kill();
    let (r, took) = within(60, move || {
        let t = Instant::now();
        (read_one(&mut q, 0), t.elapsed())
    });
    assert!(r.is_err());
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(20),
        "{took:?}"
    );
}

#[test]
fn bad_uris_and_missing_servers_are_clear_errors() {
    let dir = scratch("bad-uri");
    let missing = format!("nbd+unix:///?socket={}", dir.join("none.sock").display());
    let refused = dir.join("none.sock").display().to_string();
    for (path, needle) in [
        (
            missing.as_str(),
            format!("Failed to connect to '{refused}'"),
        ),
        (
            "nbd://127.0.0.1:1/x",
            "Failed to connect to '127.0.0.1:1'".into(),
        ),
        ("nbd+unix:///x", "needs ?socket=PATH".into()),
        ("nbds://h/x", "TLS".into()),
        (
            "nbd:localhost",
            "expected nbd:unix:PATH or nbd:HOST:PORT".into(),
        ),
    ] {
        let e = Disk::open(&DiskOptions::new(path)).err().unwrap();
        let chain = ch_log::error_chain(&e);
        assert!(chain.contains(&needle), "{path}: {chain}");
        // The URI is named once, by the block layer.
        assert_eq!(chain.matches(path).count(), 1, "{chain}");
    }
    let mut kv = ch_util::kv::KvList::parse("--disk", "path=a.raw,reconnect_delay=5").unwrap();
    let e = block::options::take_image_options(&mut kv)
        .unwrap_err()
        .to_string();
    assert!(e.contains("reconnect_delay") && e.contains("NBD"), "{e}");
}

/// What an export cannot do is the asker's mistake, named by its URI,
/// in qemu's words: a resize to another size (the same size is fine),
/// snapshots, a backing file. Nothing changes on the server.
#[test]
fn what_an_export_cannot_do_is_the_askers_mistake() {
    let kind = Kind::QemuStorageDaemon;
    if !testkit::has_command(NbdServer::tool(kind)) {
        return;
    }
    let dir = scratch("cannot");
    let img = dir.join("c.raw");
    std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    let server = NbdServer::start(kind, &img, "raw", &dir.join("c.sock"), true);
    let image = block::ExclusiveImage::open(&DiskOptions::new(&server.uri)).unwrap();
    image.resizer().resize(4 << 20).unwrap();
    let e = image.resizer().resize(8 << 20).unwrap_err();
    assert!(e.is_callers_mistake(), "{e:?}");
    assert_eq!(e.errno(), libc::EOPNOTSUPP);
    assert_eq!(
        e.to_string(),
        format!("{}: Cannot resize NBD nodes", server.uri)
    );
    let tools = image.tools();
    for e in [
        tools.snapshot_create("s", (0, 0)).unwrap_err(),
        tools.set_backing_file(Some("b"), Some("raw")).unwrap_err(),
    ] {
        assert!(
            e.is_callers_mistake() && e.to_string().starts_with(&server.uri),
            "{e}"
        );
    }
    assert_eq!(image.disk().size(), 4 << 20);
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 4 << 20);
}
