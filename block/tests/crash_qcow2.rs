//! Crash consistency of qcow2 writes: a child process writes at random and
//! flushes now and then; the parent kills it with SIGKILL mid-stream, 50
//! times over, and checks what a crash may and may not leave behind.
//!
//! The child is this test binary re-run with `CRASH_CHILD=1` and the
//! `crash_child_writer` filter. It logs "W i" to a side file before it
//! submits write i and "F i" after a flush that followed write i
//! completed. After the kill, `qemu-img check` must find no corruption
//! (leaked clusters are allowed) and every sector written before the last
//! completed flush, and not rewritten after it, must read back (through
//! `qemu-img convert`, an independent reader).

mod support;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use block::{Disk, DiskOptions, ImageType};
use support::*;

const ROUNDS: u64 = 50;
const SIZE: u64 = 4 << 20;
const SECTOR: u64 = 512;
const FLUSH_EVERY: u64 = 8;

/// Write `i` of run `seed`: offset, and its data (both deterministic).
fn write_op(seed: u64, i: u64) -> (u64, Vec<u8>) {
    let mut rng = Rng::scrambled(seed.wrapping_mul(1_000_003).wrapping_add(i));
    let max_sectors = if rng.below(4) == 0 { 384 } else { 16 };
    let len = (1 + rng.below(max_sectors)) * SECTOR;
    let off = rng.below((SIZE - len) / SECTOR + 1) * SECTOR;
    let mut data = vec![0u8; len as usize];
    rng.fill(&mut data);
    (off, data)
}

/// The child: writes until killed (bounded, in case nobody kills it).
/// Run only by the parent, as an ignored test in a child process.
#[test]
#[ignore = "the child process of the crash tests; they run it"]
fn crash_child_writer() {
    let (Ok(img), Ok(log), Ok(seed)) = (
        std::env::var("CRASH_IMG"),
        std::env::var("CRASH_LOG"),
        std::env::var("CRASH_SEED"),
    ) else {
        panic!("crash_child_writer runs only as the crash tests' child (CRASH_IMG, CRASH_LOG, CRASH_SEED)");
    };
    let seed: u64 = seed.parse().expect("CRASH_SEED");
    let mut opts = DiskOptions::new(&img);
    opts.image_type = ImageType::Format("qcow2");
    let disk = Disk::open(&opts).expect("child: open image");
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .expect("child: open log");
    for i in 0..100_000u64 {
        let (off, data) = write_op(seed, i);
        // write(2) reaches the page cache at once: a SIGKILL cannot lose it.
        writeln!(log, "W {i}").expect("child: log");
        disk.write_at(off, &data).expect("child: write");
        if i % FLUSH_EVERY == FLUSH_EVERY - 1 {
            disk.flush().expect("child: flush");
            writeln!(log, "F {i}").expect("child: log");
        }
    }
}

/// (last write started, last write covered by a completed flush).
fn parse_log(log: &Path) -> (Option<u64>, Option<u64>) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let (mut started, mut flushed) = (None, None);
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("W", n)) => started = n.parse().ok().or(started),
            Some(("F", n)) => flushed = n.parse().ok().or(flushed),
            _ => {}
        }
    }
    (started, flushed)
}

fn round(dir: &Path, seed: u64, lazy: bool) {
    let img = dir.join(format!("crash-{seed}.qcow2"));
    let log = dir.join(format!("crash-{seed}.log"));
    let img_s = img.to_str().unwrap();
    let cluster = if seed.is_multiple_of(3) {
        "4096"
    } else {
        "65536"
    };
    qemu_create(
        "qcow2",
        img_s,
        &SIZE.to_string(),
        &format!(
            "cluster_size={cluster},lazy_refcounts={}",
            if lazy { "on" } else { "off" }
        ),
    );
    std::fs::write(&log, b"").unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "--ignored",
            "crash_child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CRASH_IMG", &img)
        .env("CRASH_LOG", &log)
        .env("CRASH_SEED", seed.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    // Kill after a seed-chosen number of completed flushes (1..=6), plus a
    // seed-chosen number of writes after it, so the kill lands anywhere.
    let mut rng = Rng::scrambled(seed ^ 0xc0ffee);
    let want_flushes = 1 + rng.below(6);
    let extra_writes = rng.below(FLUSH_EVERY);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (started, flushed) = parse_log(&log);
        let flushes = flushed.map_or(0, |f| (f + 1) / FLUSH_EVERY);
        if flushes >= want_flushes && started >= flushed.map(|f| f + extra_writes) {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).ok();
            panic!("seed {seed}: child exited early ({status}):\n{err}");
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed}: child made no progress"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().expect("SIGKILL the child");
    child.wait().unwrap();

    let (started, flushed) = parse_log(&log);
    let flushed = flushed.expect("at least one flush completed");
    let started = started.unwrap_or(flushed);

    if lazy {
        // Lazy refcounts may be stale after a crash (the dirty bit says
        // so): repair with our check, after which qemu-img must find the
        // image clean, leaks included.
        our_repair_leaves_qemu_clean(&img, &format!("seed {seed}"));
    }

    // No corruption; leaks are allowed (exit 3).
    qemu_check_leaks_only(&img, &format!("seed {seed}, after the crash"));

    // Everything flushed and not rewritten since must read back.
    let mut model = vec![0u8; SIZE as usize];
    for i in 0..=flushed {
        let (off, data) = write_op(seed, i);
        model[off as usize..off as usize + data.len()].copy_from_slice(&data);
    }
    let mut uncertain = vec![false; (SIZE / SECTOR) as usize];
    for i in flushed + 1..=started {
        let (off, data) = write_op(seed, i);
        for s in off / SECTOR..(off + data.len() as u64) / SECTOR {
            uncertain[s as usize] = true;
        }
    }
    let raw = dir.join(format!("crash-{seed}.raw"));
    qemu_img(&["convert", "-O", "raw", img_s, s(&raw)]);
    let got = std::fs::read(&raw).unwrap();
    for (s, unsure) in uncertain.iter().enumerate() {
        let r = s * SECTOR as usize..(s + 1) * SECTOR as usize;
        assert!(
            *unsure || got[r.clone()] == model[r.clone()],
            "seed {seed}: sector {s} lost data flushed by write {flushed} (killed after write {started})"
        );
    }
    for f in [&img, &log, &raw] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn crash_kill9_mid_writes_never_corrupts() {
    let dir = temp_dir("ch-crash");
    for seed in 1..=ROUNDS {
        round(dir.path(), seed, false);
    }
}

/// With lazy refcounts the image is left dirty: `check_image` with
/// `Repair::All` must bring it back to a state qemu-img finds clean,
/// without losing flushed data.
#[test]
fn crash_with_lazy_refcounts_is_repaired_by_check() {
    let dir = temp_dir("ch-crash-lazy");
    for seed in 1001..=1020 {
        round(dir.path(), seed, true);
    }
}
