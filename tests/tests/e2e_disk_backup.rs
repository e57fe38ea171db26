//! End-to-end: point-in-time backups of a running disk
//! (`vm.disk-backup-begin`/`-end`, docs/backup.md) under our
//! `cloud-hypervisor` with its default seccomp filter, while the test
//! guest writes stamped rounds (`io_rounds=N`: round r is 4 KiB of
//! `0x20 + r % 0xC0` at 8 MiB + r * 4 KiB), read by clients nobody here
//! wrote.
//!
//! - A full backup, then two incrementals: each begins while the VM is paused
//!   (the rounds the guest printed tell which rounds the instant holds),
//!   the guest goes on writing while `nbdcopy` and `qemu-img convert`
//!   read the export: each holds exactly a whole-round prefix ending at
//!   its instant and, outside the rounds, what the disk holds. Each
//!   begin clears the bitmap at its instant (an action); an incremental
//!   export's `qemu:dirty-bitmap:inc` (nbdinfo, `qemu-img map` with
//!   `x-dirty-bitmap`) is what the guest wrote in between, and an
//!   incremental loop in libnbd's `nbdsh` copies only those extents into
//!   a qcow2 overlay over the previous backup (served by qemu-nbd): each
//!   point restored (full; full + 1; full + 1 + 2) equals its export.
//!   `qemu-img check` passes on the image and every backup.
//! - Refusals: unknown disk or bitmap (404), a bad address (400), a
//!   scratch file that exists or a second backup (409), resize,
//!   remove-device and an external snapshot during a backup (409).
//! - A scratch file on a full filesystem (a small tmpfs): the view
//!   breaks, the guest sees no error and its disk holds every round, the
//!   export's reads fail, and the end answers `failed` with the reason.
//! - A VMM killed (SIGKILL) while a client reads its export: the image
//!   passes `qemu-img check`, its bitmap is left in use (inconsistent)
//!   and the next VMM refuses it for a backup (409); the scratch file is
//!   left behind; a backup on TCP (port 0) is read; `vm.shutdown` ends
//!   a backup and deletes its scratch.

mod e2e_api_support;
mod e2e_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_api_support::{have_curl, ApiVm};
use integration_tests::{json, qemu_img, qemu_img_status, TempDir};

const ROUND_BASE: u64 = 8 << 20;
const ROUND_LEN: u64 = 4096;

fn stamp(r: u64) -> u8 {
    (0x20 + r % 0xC0) as u8
}

/// How many rounds `data` holds: a prefix of whole rounds, the rest
/// `other` (never a round half there, never a gap).
fn rounds_held(data: &[u8], rounds: u64, other: u8, what: &str) -> u64 {
    let mut held = 0;
    for r in 0..rounds {
        let off = (ROUND_BASE + r * ROUND_LEN) as usize;
        let block = &data[off..off + ROUND_LEN as usize];
        if block.iter().all(|&b| b == stamp(r)) {
            assert_eq!(held, r, "{what}: round {r} is there, an earlier one not");
            held += 1;
        } else {
            assert!(
                block.iter().all(|&b| b == other),
                "{what}: round {r} is neither whole nor absent"
            );
        }
    }
    held
}

/// Everything but the rounds' bytes.
fn outside_rounds(data: &[u8], rounds: u64) -> Vec<u8> {
    let start = ROUND_BASE as usize;
    let end = (ROUND_BASE + rounds * ROUND_LEN) as usize;
    let mut v = data[..start].to_vec();
    v.extend_from_slice(&data[end..]);
    v
}

fn tools() -> bool {
    have_curl()
        && ["qemu-img", "qemu-nbd", "nbdinfo", "nbdcopy", "nbdsh"]
            .iter()
            .all(|t| testkit::available(t, testkit::command(t)))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = testkit::output_within(cmd, testkit::COMMAND_LIMIT);
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Pauses the VM; the last round the guest printed before it stopped.
fn pause(vm: &ApiVm) -> u64 {
    vm.curl_ok("PUT", "vm.pause", None, 204);
    last_round(&vm.serial_text())
}

fn last_round(serial: &str) -> u64 {
    serial
        .lines()
        .filter_map(|l| l.strip_prefix("ok   round "))
        .filter_map(|n| n.trim().parse().ok())
        .max()
        .expect("the guest printed a round")
}

/// `ch-remote disk-backup-begin args...`: the export's URI.
fn begin(vm: &ApiVm, args: &[&str]) -> String {
    let mut all = vec!["disk-backup-begin"];
    all.extend_from_slice(args);
    let out = vm.ch_remote(&all);
    assert!(
        out.status.success(),
        "disk-backup-begin: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    v["uri"].as_str().expect("uri").to_string()
}

fn end(vm: &ApiVm, id: &str) -> serde_json::Value {
    let out = vm.ch_remote(&["disk-backup-end", "--disk", id]);
    assert!(
        out.status.success(),
        "disk-backup-end: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&String::from_utf8_lossy(&out.stdout))
}

/// The dirty extents of `qemu:dirty-bitmap:NAME` of an export (nbdinfo).
fn dirty_extents(uri: &str, name: &str) -> Vec<(u64, u64)> {
    let out = run_ok(Command::new("nbdinfo").args([
        "--json",
        &format!("--map=qemu:dirty-bitmap:{name}"),
        uri,
    ]));
    json(&out)
        .as_array()
        .expect("extents")
        .iter()
        .filter(|e| e["type"].as_u64() == Some(1))
        .map(|e| (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect()
}

/// The granule-aligned ranges rounds `from..to` lie in.
fn round_granules(from: u64, to: u64, granule: u64) -> (u64, u64) {
    let start = (ROUND_BASE + from * ROUND_LEN) / granule * granule;
    let end = (ROUND_BASE + to * ROUND_LEN).div_ceil(granule) * granule;
    (start, end)
}

/// The incremental loop backup tools run (virtnbdbackup's, in libnbd's
/// Python binding): the dirty extents of the bitmap context, each read
/// from the export and written to the destination export. Prints the
/// bytes it copied.
const INCREMENTAL: &str = r#"
import os, nbd
ctx = "qemu:dirty-bitmap:" + os.environ["BITMAP"]
src = nbd.NBD()
src.add_meta_context(ctx)
src.connect_uri(os.environ["SRC"])
dst = nbd.NBD()
dst.connect_uri(os.environ["DST"])
size = src.get_size()
dirty = []
pos = 0
def extents(metacontext, offset, entries, err):
    global pos
    if metacontext != ctx:
        return 0
    o = offset
    for i in range(0, len(entries), 2):
        if entries[i + 1] & 1:
            dirty.append((o, entries[i]))
        o += entries[i]
    pos = o
    return 0
while pos < size:
    src.block_status(min(size - pos, 1 << 30), pos, extents)
copied = 0
for (o, l) in dirty:
    end = min(o + l, size)
    while o < end:
        n = min(end - o, 16 << 20)
        dst.pwrite(src.pread(n, o), o)
        copied += n
        o += n
dst.flush()
dst.shutdown()
src.shutdown()
print("copied", copied)
"#;

/// Serves `image` (qcow2, writable) with qemu-nbd for one client and
/// runs the incremental loop from `uri` into it; the bytes copied.
fn incremental_into(dir: &TempDir, uri: &str, bitmap: &str, image: &str) -> u64 {
    let sock = dir.file("inc-dst.sock");
    let child = Command::new("qemu-nbd")
        .args(["-f", "qcow2", "-k", &sock, image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn qemu-nbd");
    let mut guard = testkit::ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !Path::new(&sock).exists() {
        assert!(Instant::now() < deadline, "qemu-nbd did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // nbdsh runs the `python3` it finds in PATH, and libnbd's module is
    // installed for the one beside it: that one first (a version
    // manager's python earlier in PATH lacks the module).
    let path = std::env::var_os("PATH").unwrap_or_default();
    let beside: Vec<std::path::PathBuf> = std::env::split_paths(&path)
        .filter(|d| d.join("nbdsh").is_file())
        .take(1)
        .chain(std::env::split_paths(&path))
        .collect();
    let path = std::env::join_paths(beside).expect("PATH");
    let out = run_ok(
        Command::new("nbdsh")
            .env("PATH", path)
            .args(["-c", INCREMENTAL])
            .env("SRC", uri)
            .env("DST", format!("nbd+unix:///?socket={sock}"))
            .env("BITMAP", bitmap),
    );
    // qemu-nbd ends when its one client has gone (the overlay closed).
    let deadline = Instant::now() + Duration::from_secs(30);
    while guard.try_wait().expect("try_wait").is_none() {
        assert!(Instant::now() < deadline, "qemu-nbd did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    out.trim()
        .strip_prefix("copied ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("nbdsh printed {out:?}"))
}

fn qemu_check(img: &str) {
    let out = qemu_img_status(&["check", img]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("No errors"),
        "qemu-img check {img}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Incremental backup `n`: the VM paused after the guest wrote 60 more
/// rounds than `prev` (the last round printed at the previous instant),
/// a backup begun with bitmap `inc` (cleared at the instant for the
/// next one), the VM resumed; its bitmap checked against the rounds
/// (nbdinfo, and qemu-img map with x-dirty-bitmap), the nbdsh loop into
/// a new overlay over `backing`, and the overlay's chain compared with
/// the export and the rounds of its instant. The overlay and the last
/// round printed at its instant.
fn incremental(
    vm: &mut ApiVm,
    dir: &TempDir,
    n: u32,
    prev: u64,
    backing: &str,
    rounds: u64,
) -> (String, u64) {
    vm.wait_for(&format!("ok   round {}\n", prev + 60));
    let p = pause(vm);
    assert!(p + 40 < rounds, "the guest is too far ahead");
    let sock = dir.file(&format!("inc{n}.sock"));
    let clear = r#"[{"type":"bitmap-clear","data":{"id":"d0","name":"inc"}}]"#;
    let uri = begin(
        vm,
        &[
            "--disk",
            "d0",
            "--addr",
            &format!("unix:{sock}"),
            "--name",
            "inc-export",
            "--scratch",
            &dir.file(&format!("scratch-inc{n}.qcow2")),
            "--bitmap",
            "inc",
            "--actions",
            clear,
        ],
    );
    vm.curl_ok("PUT", "vm.resume", None, 204);
    vm.wait_for(&format!("ok   round {}\n", p + 20));
    let dirty = dirty_extents(&uri, "inc");
    let (lo, hi) = round_granules(prev + 2, p + 1, 65536);
    let (first, last) = round_granules(prev, p + 2, 65536);
    assert!(
        dirty.len() == 1
            && dirty[0].0 <= lo
            && dirty[0].0 + dirty[0].1 >= hi
            && dirty[0].0 >= first
            && dirty[0].0 + dirty[0].1 <= last,
        "increment {n}: {dirty:?} is not the rounds written between the instants ({prev}..{p})"
    );
    // qemu-img reads the bitmap through its allocation map, inverted.
    let map = json(&run_ok(Command::new("qemu-img").args([
        "map",
        "--output=json",
        "--image-opts",
        &format!(
            "driver=nbd,server.type=unix,server.path={sock},export=inc-export,x-dirty-bitmap=qemu:dirty-bitmap:inc"
        ),
    ])));
    let by_qemu: Vec<(u64, u64)> = map
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"] == false)
        .map(|e| (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect();
    assert_eq!(by_qemu, dirty, "increment {n}");
    let overlay = dir.file(&format!("inc{n}.qcow2"));
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", backing, "-F", "qcow2", &overlay,
    ]);
    let copied = incremental_into(dir, &uri, "inc", &overlay);
    let dirty_bytes: u64 = dirty.iter().map(|e| e.1).sum();
    assert_eq!(
        copied, dirty_bytes,
        "increment {n}: the loop reads exactly the dirty extents"
    );
    assert!(copied < 1 << 20, "increment {n} of {copied} bytes");
    // The restore of this point: the chain up to this overlay.
    let restored = dir.file(&format!("restored{n}.raw"));
    qemu_img(&["convert", "-O", "raw", &overlay, &restored]);
    let view = dir.file(&format!("view{n}.raw"));
    run_ok(Command::new("nbdcopy").args([&uri, &view]));
    let restored_data = read(&restored);
    assert!(
        restored_data == read(&view),
        "the chain up to increment {n} differs from its export"
    );
    let k = rounds_held(&restored_data, rounds, 0, &format!("increment {n}"));
    assert!(
        (p + 1..=p + 2).contains(&k),
        "the chain up to increment {n} holds {k} rounds; the guest had printed round {p}"
    );
    assert_eq!(end(vm, "d0")["status"], "completed");
    for f in [&restored, &view] {
        std::fs::remove_file(f).unwrap();
    }
    (overlay, p)
}

#[test]
fn full_and_incremental_backups_hold_the_disk_at_their_instants() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("backup-guest");
    let img = dir.file("a.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    let rounds = 700u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("io_rounds={rounds} park"),
        &["--disk", &format!("path={img},id=d0,num_queues=2")],
    );
    vm.wait_for("ok   round 10\n");
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"d0","name":"inc","persistent":true}"#),
        204,
    );
    vm.wait_for("ok   round 60\n");

    // The full backup: its instant while the VM is paused; the bitmap
    // cleared at the same instant starts the next increment.
    let p1 = pause(&vm);
    let sock1 = dir.file("full.sock");
    let clear = r#"[{"type":"bitmap-clear","data":{"id":"d0","name":"inc"}}]"#;
    let uri1 = begin(
        &vm,
        &[
            "--disk",
            "d0",
            "--addr",
            &format!("unix:{sock1}"),
            "--scratch",
            &dir.file("scratch1.qcow2"),
            "--bitmap",
            "inc",
            "--actions",
            clear,
        ],
    );
    assert_eq!(uri1, format!("nbd+unix:///d0?socket={sock1}"));
    // The bitmap as it stood at the instant: the rounds written since it
    // was added (the guest writes nothing else meanwhile).
    let dirty1 = dirty_extents(&uri1, "inc");
    let (lo, hi) = round_granules(11, p1 + 1, 65536);
    assert!(
        dirty1.len() == 1 && dirty1[0].0 <= lo && dirty1[0].0 + dirty1[0].1 >= hi,
        "{dirty1:?} does not cover rounds 11..={p1} ({lo}..{hi})"
    );
    vm.curl_ok("PUT", "vm.resume", None, 204);
    vm.wait_for(&format!("ok   round {}\n", p1 + 20));
    // A client that goes away in the middle of its reads.
    let mut gone = testkit::ChildGuard(
        Command::new("nbdcopy")
            .args([&uri1, "null:"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nbdcopy"),
    );
    std::thread::sleep(Duration::from_millis(30));
    let _ = gone.kill();
    let _ = gone.wait();
    let full_raw = dir.file("full.raw");
    run_ok(Command::new("nbdcopy").args([&uri1, &full_raw]));
    let full = dir.file("full.qcow2");
    run_ok(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "qcow2", &uri1, &full]));
    run_ok(
        Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "qcow2", &full_raw, &full]),
    );
    let full_data = read(&full_raw);
    let k1 = rounds_held(&full_data, rounds, 0, "the full backup");
    assert!(
        (p1 + 1..=p1 + 2).contains(&k1),
        "the full backup holds {k1} rounds; the guest had printed round {p1} at the instant"
    );
    let ended = end(&vm, "d0");
    assert_eq!(ended["status"], "completed", "{ended}");
    assert!(ended["copied_bytes"].as_u64().unwrap() > 0, "{ended}");
    assert!(!Path::new(&dir.file("scratch1.qcow2")).exists());
    assert!(!Path::new(&sock1).exists());

    // Two incrementals: what the guest wrote since the previous instant,
    // each into an overlay over the previous backup.
    let (inc1, p2) = incremental(&mut vm, &dir, 1, p1, &full, rounds);
    let (inc2, _) = incremental(&mut vm, &dir, 2, p2, &inc1, rounds);

    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    for image in [&img, &full, &inc1, &inc2] {
        qemu_check(image);
    }
    let now = dir.file("now.raw");
    qemu_img(&["convert", "-O", "raw", &img, &now]);
    let now_data = read(&now);
    assert_eq!(rounds_held(&now_data, rounds, 0, "the disk"), rounds);
    assert!(
        outside_rounds(&full_data, rounds) == outside_rounds(&now_data, rounds),
        "the full backup differs from the disk outside the rounds"
    );
}

/// A tmpfs of `size` mounted at `path`, unmounted when dropped.
struct SmallFs(String);

impl SmallFs {
    fn mount(path: &str, size: &str) -> Result<SmallFs, String> {
        std::fs::create_dir_all(path).map_err(|e| e.to_string())?;
        let out = testkit::output_within(
            Command::new("mount").args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                path,
            ]),
            testkit::COMMAND_LIMIT,
        );
        if out.status.success() {
            Ok(SmallFs(path.to_string()))
        } else {
            Err(format!(
                "mount -t tmpfs (needs root): {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = testkit::output_within(Command::new("umount").arg(&self.0), testkit::COMMAND_LIMIT);
    }
}

#[test]
fn refusals_and_a_scratch_that_fills_up() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("backup-faults");
    let small = dir.file("small");
    let fs = match SmallFs::mount(&small, "512k") {
        Ok(fs) => Some(fs),
        Err(why) => {
            testkit::available("a small tmpfs for the scratch file", Err(why));
            None
        }
    };
    let Some(_fs) = fs else { return };
    // Data everywhere: each granule the guest writes after the instant
    // must be copied.
    let img = dir.file("a.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "16M"]);
    run_ok(Command::new("qemu-io").args(["-f", "raw", "-c", "write -q -P 0x5a 0 16M", &img]));
    let rounds = 300u64;
    let mut vm = ApiVm::start(
        &dir,
        &format!("io_rounds={rounds} park"),
        &["--disk", &format!("path={img},id=d0")],
    );
    vm.wait_for("ok   round 5\n");
    let sock = dir.file("b.sock");
    let scratch = format!("{small}/scratch.qcow2");
    let body = |id: &str, addr: &str, scratch: &str, extra: &str| {
        format!(r#"{{"id":"{id}","addr":"{addr}","scratch":"{scratch}"{extra}}}"#)
    };
    let unix = format!("unix:{sock}");
    // Refusals before any backup.
    let cases = [
        (body("nope", &unix, &scratch, ""), 404),
        (body("d0", &unix, &scratch, r#","bitmap":"nope""#), 404),
        (body("d0", "udp:1.2.3.4:5", &scratch, ""), 400),
        (body("d0", &unix, &img, ""), 409),
    ];
    for (b, want) in &cases {
        let (status, text) = vm.curl("PUT", "vm.disk-backup-begin", Some(b));
        assert_eq!(status, *want, "{b}: {text}");
    }
    assert!(
        !Path::new(&scratch).exists(),
        "a refused begin left its scratch"
    );
    assert!(
        !Path::new(&sock).exists(),
        "a refused begin left its socket"
    );
    vm.curl_ok("PUT", "vm.disk-backup-end", Some(r#"{"id":"d0"}"#), 404);
    // An address that cannot be used refuses the backup before its
    // actions run: the bitmap they would clear keeps its marks.
    vm.curl_ok(
        "PUT",
        "vm.disk-bitmap-add",
        Some(r#"{"id":"d0","name":"m"}"#),
        204,
    );
    let after = last_round(&vm.serial_text()) + 3;
    vm.wait_for(&format!("ok   round {after}\n"));
    let clear = r#","actions":[{"type":"bitmap-clear","data":{"id":"d0","name":"m"}}]"#;
    let taken = format!("unix:{img}");
    let (status, text) = vm.curl(
        "PUT",
        "vm.disk-backup-begin",
        Some(&body("d0", &taken, &scratch, clear)),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("already exists"), "{text}");
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    assert!(
        info[0]["dirty-bitmaps"][0]["count"].as_u64().unwrap() > 0,
        "{info}"
    );
    assert!(!Path::new(&scratch).exists());
    let uri = json(&vm.curl_ok(
        "PUT",
        "vm.disk-backup-begin",
        Some(&body("d0", &unix, &scratch, "")),
        200,
    ))["uri"]
        .as_str()
        .unwrap()
        .to_string();
    // Refusals while it runs.
    let other = dir.file("other.qcow2");
    let during = [
        (
            "vm.disk-backup-begin",
            body("d0", &format!("unix:{sock}2"), &other, ""),
        ),
        (
            "vm.resize-disk",
            r#"{"id":"d0","desired_size":33554432}"#.to_string(),
        ),
        ("vm.remove-device", r#"{"id":"d0"}"#.to_string()),
        (
            "vm.disk-snapshot-external",
            format!(r#"{{"disks":[{{"id":"d0","overlay":"{other}"}}]}}"#),
        ),
    ];
    for (endpoint, b) in &during {
        let (status, text) = vm.curl("PUT", endpoint, Some(b));
        assert_eq!(status, 409, "{endpoint} {b}: {text}");
    }
    assert!(!Path::new(&other).exists());
    // The guest writes on; its copies fill the scratch's filesystem.
    vm.wait_for(&format!("ok   all {rounds} rounds read back"));
    let info = json(&vm.curl_ok("PUT", "vm.disk-info", Some(r#"{"id":"d0"}"#), 200));
    let backup = &info[0]["backup"];
    assert_eq!(backup["uri"], uri.as_str(), "{info}");
    assert_eq!(backup["broken"], true, "{info}");
    assert!(
        backup["error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left on device")),
        "{info}"
    );
    let out = testkit::output_within(
        Command::new("nbdcopy").args([&uri, &dir.file("broken.raw")]),
        testkit::COMMAND_LIMIT,
    );
    assert!(!out.status.success(), "reading a broken view succeeded");
    let ended = vm.curl_ok("PUT", "vm.disk-backup-end", Some(r#"{"id":"d0"}"#), 200);
    let ended = json(&ended);
    assert_eq!(ended["status"], "failed", "{ended}");
    let why = ended["error"].as_str().unwrap_or_default();
    assert!(why.contains("No space left on device"), "{ended}");
    assert!(!Path::new(&scratch).exists(), "the scratch was not removed");
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    // The guest's disk holds every round.
    assert_eq!(rounds_held(&read(&img), rounds, 0x5a, "the disk"), rounds);
}

/// `(name, flags)` of the bitmaps `qemu-img info` lists.
fn image_bitmaps(img: &str) -> Vec<(String, Vec<String>)> {
    let info = json(&qemu_img(&["info", "-U", "--output=json", img]));
    info["format-specific"]["data"]["bitmaps"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| {
                    let flags = b["flags"]
                        .as_array()
                        .expect("flags")
                        .iter()
                        .map(|f| f.as_str().expect("a flag").to_string())
                        .collect();
                    (b["name"].as_str().expect("name").to_string(), flags)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_vmm_killed_mid_backup_leaves_a_sound_image_and_inconsistent_bitmaps() {
    if !tools() {
        return;
    }
    let dir = TempDir::new("backup-kill");
    let img = dir.file("a.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    qemu_img(&["bitmap", "--add", &img, "inc"]);
    let disk = format!("path={img},id=d0");
    let mut vm = ApiVm::start(&dir, "io_rounds=300 park", &["--disk", &disk]);
    vm.wait_for("ok   round 10\n");
    let scratch = dir.file("scratch.qcow2");
    let sock = dir.file("b.sock");
    let uri = begin(
        &vm,
        &[
            "--disk",
            "d0",
            "--addr",
            &format!("unix:{sock}"),
            "--scratch",
            &scratch,
            "--bitmap",
            "inc",
        ],
    );
    vm.wait_for("ok   round 30\n");
    // A reader in the middle of the export when the VMM dies.
    let mut reader = testkit::ChildGuard(
        Command::new("nbdcopy")
            .args([&uri, "null:"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nbdcopy"),
    );
    drop(vm); // SIGKILL
    let deadline = Instant::now() + Duration::from_secs(30);
    while reader.try_wait().expect("try_wait").is_none() {
        assert!(Instant::now() < deadline, "nbdcopy hangs on a dead export");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The kernel lets go of a dead process's io_uring files (and so the
    // image's lock) a moment after the process is gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while e2e_api_support::locked(&img) {
        assert!(Instant::now() < deadline, "the killed VMM's lock stays");
        std::thread::sleep(Duration::from_millis(50));
    }
    qemu_check(&img);
    assert_eq!(
        image_bitmaps(&img),
        vec![(
            "inc".to_string(),
            vec!["in-use".to_string(), "auto".to_string()]
        )],
        "the bitmap is left in use: inconsistent"
    );
    // The scratch file is left behind (nobody was there to delete it);
    // the next VMM refuses the inconsistent bitmap for a backup.
    assert!(Path::new(&scratch).exists());
    std::fs::remove_file(&scratch).unwrap();
    let _ = std::fs::remove_file(&sock);
    let dir2 = TempDir::new("backup-kill-again");
    let vm = ApiVm::start(&dir2, "park", &["--disk", &disk]);
    let body =
        format!(r#"{{"id":"d0","addr":"unix:{sock}","scratch":"{scratch}","bitmap":"inc"}}"#);
    let (status, text) = vm.curl("PUT", "vm.disk-backup-begin", Some(&body));
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("inconsistent"), "{text}");
    assert!(!Path::new(&scratch).exists());
    // Without the bitmap a full backup works, here on TCP (port 0: any
    // free port, named in the URI).
    let body = format!(r#"{{"id":"d0","addr":"tcp:127.0.0.1:0","scratch":"{scratch}"}}"#);
    let begun = json(&vm.curl_ok("PUT", "vm.disk-backup-begin", Some(&body), 200));
    let uri = begun["uri"].as_str().expect("uri");
    assert!(
        uri.starts_with("nbd://127.0.0.1:") && uri.ends_with("/d0") && !uri.contains(":0/"),
        "{uri}"
    );
    let size = run_ok(Command::new("nbdinfo").args(["--size", uri]));
    assert_eq!(size.trim(), (16u64 << 20).to_string());
    let (status, err) = vm.shutdown();
    assert!(status.success(), "{status}: {err}");
    assert!(!Path::new(&scratch).exists(), "vm.shutdown ends the backup");
    qemu_check(&img);
}
