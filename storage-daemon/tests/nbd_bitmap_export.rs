//! `--export type=nbd,bitmap=NAME`: a qcow2 image's persistent dirty
//! bitmap as the `qemu:dirty-bitmap:NAME` meta context, read by clients
//! nobody here wrote (nbdinfo, qemu-img with `x-dirty-bitmap`) and by a
//! raw client that selects it beside `base:allocation`, compared with what
//! qemu-storage-daemon answers for the same image and bitmap: the same
//! bytes, but for the socket's name. Bitmaps are made with `qemu-img
//! bitmap` and filled by writes through qemu-io, so both servers read the
//! same bits. A missing or inconsistent bitmap is refused in
//! qemu-storage-daemon's words; a read-write image is refused before it
//! is opened, and left as it was.

mod nbd_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nbd_support::{have, run, scratch, sh, try_run, unix_uri, Daemon};

/// 64 MiB and 2560 bytes: the last 64 KiB granule is partial.
const SIZE: u64 = (64 << 20) + 2560;

/// The tools every test here needs.
fn tools() -> bool {
    have(&["qemu-img", "qemu-io", "nbdinfo", "qemu-storage-daemon"])
}

/// A qcow2 image with three bitmaps: `b0` (64 KiB granules) sees every
/// write, `small` (4 KiB) the later ones, `later` was disabled for some
/// of them. Writes are unaligned, across granules and at the end.
fn make_image(dir: &Path) -> String {
    let img = dir.join("img.qcow2");
    let i = img.display();
    sh(&format!(
        "qemu-img create -q -f qcow2 {i} {SIZE} && \
         qemu-img bitmap --add {i} b0 && \
         qemu-io -f qcow2 -c 'write -P 1 0 512' -c 'write -P 2 1M 64k' \
                 -c 'write -P 3 10M 200k' -c 'write 5000 3000' {i} >/dev/null && \
         qemu-img bitmap --add -g 4096 {i} small && \
         qemu-img bitmap --add {i} later && qemu-img bitmap --disable {i} later && \
         qemu-io -f qcow2 -c 'write -P 4 20M 12k' -c 'write -P 5 67106816 4096' {i} >/dev/null && \
         qemu-img bitmap --enable {i} later && \
         qemu-io -f qcow2 -c 'write -P 6 31457281 1' -c 'write -z 40M 1M' {i} >/dev/null"
    ));
    img.display().to_string()
}

/// qemu-storage-daemon serving `img` read-only as export `disk` with
/// `bitmap`, killed when dropped.
struct Qsd {
    child: testkit::ChildGuard,
    log: PathBuf,
}

fn qsd_command(img: &str, sock: &Path, bitmap: &str, log: &Path, read_only: bool) -> Command {
    let ro = if read_only { ",read-only=on" } else { "" };
    let bitmaps = if bitmap.is_empty() {
        String::new()
    } else {
        format!(",bitmaps.0={bitmap}")
    };
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.args([
        "--blockdev",
        &format!("driver=file,filename={img},node-name=f{ro}"),
        "--blockdev",
        &format!("driver=qcow2,file=f,node-name=d{ro}"),
        "--nbd-server",
        &format!("addr.type=unix,addr.path={}", sock.display()),
        "--export",
        &format!("type=nbd,node-name=d,id=e,name=disk{bitmaps}"),
    ])
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(log).unwrap());
    cmd
}

impl Qsd {
    /// Starts it; `Err` is its log when it exits instead of listening.
    fn start(img: &str, sock: &Path, bitmap: &str, read_only: bool) -> Result<Qsd, String> {
        let log = sock.with_extension("log");
        let child = qsd_command(img, sock, bitmap, &log, read_only)
            .spawn()
            .unwrap();
        let mut q = Qsd {
            child: testkit::ChildGuard(child),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !sock.exists() {
            if q.child.try_wait().unwrap().is_some() {
                return Err(std::fs::read_to_string(&q.log).unwrap_or_default());
            }
            assert!(
                Instant::now() < deadline,
                "qemu-storage-daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(q)
    }

    /// SIGTERM, then a clean exit (it closes the image).
    fn stop(mut self) {
        testkit::stop_cleanly(
            &mut self.child,
            "qemu-storage-daemon",
            Duration::from_secs(30),
            &self.log,
        );
    }
}

/// A client that selects `base:allocation` and the bitmap's context,
/// then asks for block status of several ranges (REQ_ONE for some), and
/// writes down what the server says: the contexts and ids it selected,
/// then per request and chunk the context, the chunk's flags and, for
/// the bitmap, the extents (the allocation chunk only by its presence:
/// see [`clients_read`]). Handwritten from the protocol, so that the two
/// servers' answers are compared as they are on the wire.
fn both_contexts(sock: &Path, bitmap: &str, size: u64) -> String {
    use nbd::wire::consts::{chunk, cmd, cmd_flag, handshake, opt, rep, STRUCTURED_REPLY_MAGIC};
    use nbd::wire::{
        be32, put_string, ChunkHeader, OptionHeader, OptionReplyHeader, RequestHeader,
    };
    use std::io::{Read, Write};

    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    let flags = u32::from(handshake::FIXED_NEWSTYLE | handshake::NO_ZEROES);
    s.write_all(&flags.to_be_bytes()).unwrap();
    // Sends an option; returns its replies up to the ACK.
    let option = |s: &mut std::os::unix::net::UnixStream, o: u32, data: &[u8]| {
        let mut b = Vec::new();
        OptionHeader::new(o, data.len() as u32).encode(&mut b);
        b.extend_from_slice(data);
        s.write_all(&b).unwrap();
        let mut replies = Vec::new();
        loop {
            let mut h = [0u8; OptionReplyHeader::SIZE];
            s.read_exact(&mut h).unwrap();
            let h = OptionReplyHeader::decode(&h);
            let mut d = vec![0u8; h.len as usize];
            s.read_exact(&mut d).unwrap();
            assert!(
                h.reply == rep::ACK || h.reply == rep::META_CONTEXT || h.reply == rep::INFO,
                "reply {:#x}",
                h.reply
            );
            if h.reply == rep::ACK {
                return replies;
            }
            replies.push((h.reply, d));
        }
    };
    let mut out = String::new();
    option(&mut s, opt::STRUCTURED_REPLY, &[]);
    let mut d = Vec::new();
    put_string(&mut d, b"disk");
    d.extend_from_slice(&2u32.to_be_bytes());
    put_string(&mut d, b"base:allocation");
    put_string(&mut d, format!("qemu:dirty-bitmap:{bitmap}").as_bytes());
    let mut names = std::collections::HashMap::new();
    for (_, r) in option(&mut s, opt::SET_META_CONTEXT, &d) {
        let name = String::from_utf8(r[4..].to_vec()).unwrap();
        out += &format!("context {} id {}\n", name, be32(&r, 0));
        names.insert(be32(&r, 0), name);
    }
    let mut d = Vec::new();
    put_string(&mut d, b"disk");
    d.extend_from_slice(&0u16.to_be_bytes());
    option(&mut s, opt::GO, &d);
    let requests = [
        (0, size as u32, 0),
        (5000, 1 << 20, 0),
        (1048676, 9000000, cmd_flag::REQ_ONE),
        (size - 70000, 70000, 0),
        (20 << 20, 4096, cmd_flag::REQ_ONE),
        (31457280, 1, 0),
    ];
    for (cookie, (offset, len, flags)) in requests.into_iter().enumerate() {
        let mut b = Vec::new();
        RequestHeader::new(cmd::BLOCK_STATUS, flags, cookie as u64, offset, len).encode(&mut b);
        s.write_all(&b).unwrap();
        out += &format!("request {offset}+{len} flags {flags}\n");
        loop {
            let mut h = [0u8; ChunkHeader::SIZE];
            s.read_exact(&mut h).unwrap();
            let h = ChunkHeader::decode(&h);
            assert_eq!((h.magic, h.cookie), (STRUCTURED_REPLY_MAGIC, cookie as u64));
            let mut p = vec![0u8; h.len as usize];
            s.read_exact(&mut p).unwrap();
            assert_eq!(
                h.kind,
                chunk::BLOCK_STATUS,
                "{:?}",
                String::from_utf8_lossy(&p)
            );
            let name = &names[&be32(&p, 0)];
            let extents: Vec<(u32, u32)> =
                p[4..].chunks(8).map(|e| (be32(e, 0), be32(e, 4))).collect();
            if name == "base:allocation" {
                assert!(!extents.is_empty());
                out += &format!("  {name} flags {}\n", h.flags);
            } else {
                out += &format!("  {name} flags {} {extents:?}\n", h.flags);
            }
            if h.flags & chunk::FLAG_DONE != 0 {
                break;
            }
        }
    }
    out
}

/// What the clients print for `bitmap` of the export on `sock`, with the
/// socket's path taken out. `base:allocation` itself is not compared
/// (the two servers' allocation status differs inside partly written
/// clusters: ours reads the holes of the image file, as `qemu-img map`
/// does locally; nbd_export.rs holds ours to the local map).
fn clients_read(sock: &Path, bitmap: &str) -> Vec<(String, String)> {
    let uri = unix_uri(sock, "disk");
    let context = format!("--map=qemu:dirty-bitmap:{bitmap}");
    let image_opts = format!(
        "driver=nbd,server.type=unix,server.path={},export=disk,x-dirty-bitmap=qemu:dirty-bitmap:{bitmap}",
        sock.display()
    );
    let mut outputs = vec![
        (
            "nbdinfo --map",
            run(Command::new("nbdinfo").args([&context, &uri])),
        ),
        (
            "nbdinfo --map --json",
            run(Command::new("nbdinfo").args([&context, "--json", &uri])),
        ),
        (
            "nbdinfo --map --totals",
            run(Command::new("nbdinfo").args([&context, "--totals", &uri])),
        ),
        (
            "nbdinfo --json",
            run(Command::new("nbdinfo").args(["--json", &uri])),
        ),
        (
            "nbdinfo --list --json",
            run(Command::new("nbdinfo").args(["--list", "--json", &unix_uri(sock, "")])),
        ),
        (
            "qemu-img map x-dirty-bitmap",
            run(Command::new("qemu-img").args([
                "map",
                "--output=json",
                "--image-opts",
                &image_opts,
            ])),
        ),
    ];
    outputs.push((
        "both contexts on the wire",
        both_contexts(sock, bitmap, SIZE),
    ));
    let shown = sock.display().to_string();
    outputs
        .into_iter()
        .map(|(what, out)| (what.to_string(), out.replace(&shown, "SOCKET")))
        .collect()
}

#[test]
fn bitmaps_read_as_qemu_storage_daemon_serves_them() {
    if !tools() {
        return;
    }
    let dir = scratch("bitmap-export");
    let img = make_image(&dir);
    for bitmap in ["b0", "small", "later"] {
        let sock = dir.join(format!("ours-{bitmap}.sock"));
        let d = Daemon::start(
            &dir,
            &format!("path={img},readonly=on"),
            &format!("addr=unix:{},name=disk,bitmap={bitmap}", sock.display()),
        );
        let ours = clients_read(&sock, bitmap);
        let log = d.stop();
        assert!(
            log.contains(&format!(
                "contexts base:allocation, qemu:dirty-bitmap:{bitmap}"
            )),
            "{log}"
        );
        let qsock = dir.join(format!("qsd-{bitmap}.sock"));
        let q = Qsd::start(&img, &qsock, bitmap, true).unwrap();
        let theirs = clients_read(&qsock, bitmap);
        q.stop();
        for ((what, a), (_, b)) in ours.iter().zip(&theirs) {
            assert_eq!(
                a, b,
                "{what} of bitmap {bitmap}: ours, then qemu-storage-daemon's"
            );
        }
    }
    // What the bitmaps hold, as read above (the comparison holds both
    // servers to it).
    let sock = dir.join("ours.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={img},readonly=on"),
        &format!("addr=unix:{},name=disk,bitmap=later", sock.display()),
    );
    let map =
        run(Command::new("nbdinfo")
            .args(["--map=qemu:dirty-bitmap:later", &unix_uri(&sock, "disk")]));
    d.stop();
    assert_eq!(
        map,
        "         0    31457280    0  clean\n  \
         31457280       65536    1  dirty\n  \
         31522816    10420224    0  clean\n  \
         41943040     1048576    1  dirty\n  \
         42991616    24119808    0  clean\n"
    );
}

#[test]
fn missing_and_inconsistent_bitmaps_are_refused_in_qemus_words() {
    if !tools() {
        return;
    }
    let dir = scratch("bitmap-refused");
    let img = make_image(&dir);
    let sock = dir.join("s.sock");
    let ours = |bitmap: &str| {
        Daemon::try_start(
            &dir,
            &format!("path={img},readonly=on"),
            &format!("addr=unix:{},name=disk,bitmap={bitmap}", sock.display()),
        )
        .err()
        .expect("the daemon refuses the bitmap")
    };
    // It listens before it looks at the export: wait for its exit.
    let theirs = |bitmap: &str| {
        let log = dir.join("q.log");
        let mut cmd = qsd_command(&img, &dir.join("q.sock"), bitmap, &log, true);
        let out = testkit::output_within(&mut cmd, testkit::COMMAND_LIMIT);
        assert!(
            !out.status.success(),
            "qemu-storage-daemon took bitmap {bitmap}"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = "Bitmap 'nope' is not found";
    let (o, t) = (ours("nope"), theirs("nope"));
    assert!(
        o.contains(said) && t.contains(said),
        "ours: {o}\nqemu-storage-daemon: {t}"
    );
    assert!(!sock.exists());

    // qemu-storage-daemon killed while it holds the image read-write
    // leaves every bitmap in use: inconsistent.
    let held = dir.join("held.sock");
    let mut q = Qsd::start(&img, &held, "", false).unwrap();
    q.child.kill().unwrap();
    q.child.wait().unwrap();
    let info = run(Command::new("qemu-img").args(["info", &img]));
    assert!(info.contains("in-use"), "{info}");
    let said = "Bitmap 'b0' is inconsistent and cannot be used";
    let (o, t) = (ours("b0"), theirs("b0"));
    assert!(
        o.contains(said) && t.contains(said),
        "ours: {o}\nqemu-storage-daemon: {t}"
    );
}

#[test]
fn a_read_write_image_is_refused_before_it_is_opened() {
    if !tools() {
        return;
    }
    let dir = scratch("bitmap-rw");
    let img = make_image(&dir);
    let before = std::fs::read(&img).unwrap();
    let sock = dir.join("s.sock");
    for export in ["bitmap=b0", "bitmap=b0,writable=on"] {
        let err = Daemon::try_start(
            &dir,
            &format!("path={img}"),
            &format!("addr=unix:{},name=disk,{export}", sock.display()),
        )
        .err()
        .expect("refused");
        assert!(err.contains("exit status: 2"), "{err}");
        assert!(err.contains("needs --image ...,readonly=on"), "{err}");
    }
    assert_eq!(
        std::fs::read(&img).unwrap(),
        before,
        "the image was changed"
    );
    // A writable export of a read-only image is refused too.
    let err = Daemon::try_start(
        &dir,
        &format!("path={img},readonly=on"),
        &format!(
            "addr=unix:{},name=disk,bitmap=b0,writable=on",
            sock.display()
        ),
    )
    .err()
    .expect("refused");
    assert!(
        err.contains("writable=on needs an image opened read-write"),
        "{err}"
    );
    let (ok, text) = try_run(Command::new("qemu-img").args(["check", &img]));
    assert!(ok, "{text}");
    assert!(!sock.exists());
}
