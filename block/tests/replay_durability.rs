//! Durability by replaying the write log, without the page cache.
//!
//! A random workload (allocating writes, overwrites, discards,
//! write-zeroes, flushes; 1 or 4 queues; with or without a backing file
//! and internal snapshots; 4 KiB or 64 KiB clusters; lazy refcounts on or
//! off) runs on a qcow2 image with every write, fallocate and fdatasync
//! that reaches the image file logged, from the metadata seam and from the
//! queues' engines. Crash images are then built from the log: everything
//! made durable by a barrier, plus any subset (whole, torn or lost, in any
//! order) of the writes that might have reached the disk (see
//! `replay_support::crash`). Each must pass `qemu-img check` with nothing
//! worse than leaks, and read back (through our block layer, and through
//! qemu-img convert for every fourth image) with every write acknowledged
//! before a completed FLUSH intact (see `replay_support::oracle`).
//!
//! `REPLAY_CRASH_IMAGES=N` sets how many crash images each engine's test
//! builds (default 200 for sync, 100 for io_uring); `REPLAY_SEED=S` runs
//! the one recorded run of seed S (what a failure message names);
//! half of the 4-queue runs are driven from one thread per queue
//! (`REPLAY_THREADS=0` turns that off, to tell a threading failure from
//! another);
//! `REPLAY_KEEP=DIR` keeps a failing crash image and the run's log.

mod replay_support;
mod support;

use std::path::Path;
use std::time::Instant;

use block::{Disk, DiskOptions, EngineKind};
use replay_support::crash::{CrashImage, Timeline};
use replay_support::oracle::Oracle;
use replay_support::workload::{self, Config, Recording};
use support::*;

/// Crash images built from each recorded run.
const IMAGES_PER_RUN: usize = 25;

/// How a crash image is read back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reader {
    Ours,
    OursAndQemu,
}

/// Crash images of one run that passed, and sectors that had to hold
/// flushed data.
#[derive(Default)]
struct Tally {
    runs: usize,
    images: usize,
    durable_sectors: usize,
}

/// The disk's contents read from a crash image by our block layer.
fn read_ours(p: &Path) -> Result<Vec<u8>, String> {
    let mut o = DiskOptions::new(p);
    o.readonly = true;
    o.lock = false;
    let disk = Disk::open(&o).map_err(|e| format!("our open failed: {e}"))?;
    let mut buf = vec![0u8; disk.size() as usize];
    disk.read_at(0, &mut buf)
        .map_err(|e| format!("our read failed: {e}"))?;
    Ok(buf)
}

/// Writes `bytes` as a crash image and checks it: qemu-img check finds at
/// most leaks, and what the guest reads back obeys the oracle. Returns
/// the sectors that had to be durable.
fn check_crash_image(
    dir: &Path,
    crash: &CrashImage,
    oracle: &Oracle,
    c: usize,
    reader: Reader,
) -> Result<usize, String> {
    let img = dir.join("crash.qcow2");
    crash
        .write_to(&img)
        .map_err(|e| format!("write crash image: {e}"))?;
    let out = qemu_img_output(&["check", s(&img)]);
    let code = out.status.code().unwrap_or(-1);
    if code != 0 && code != 3 {
        return Err(format!(
            "CORRUPTION: qemu-img check exited {code}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let must = oracle.check(c, &read_ours(&img)?)?;
    if reader == Reader::OursAndQemu {
        let raw = dir.join("crash.raw");
        let (ok, text) = run_status("qemu-img", &["convert", "-O", "raw", s(&img), s(&raw)]);
        if !ok {
            return Err(format!("qemu-img convert failed: {text}"));
        }
        let got = std::fs::read(&raw).map_err(|e| format!("read converted image: {e}"))?;
        oracle
            .check(c, &got)
            .map_err(|e| format!("read back by qemu-img convert: {e}"))?;
    }
    Ok(must)
}

/// Records run `seed` on `engine` in `dir`.
fn record(dir: &TempDir, seed: u64, engine: EngineKind) -> (Config, Recording) {
    let cfg = Config::for_seed(seed, engine);
    let img = workload::make_image(dir.path(), &cfg, seed);
    (cfg, workload::record(dir.path(), &img, &cfg, seed))
}

/// Records run `seed`, builds `images` crash images from its log and
/// checks each; panics naming the seed, image and crash point.
fn replay_run(seed: u64, engine: EngineKind, images: usize, tally: &mut Tally) {
    let dir = temp_dir("replay");
    let (cfg, rec) = record(&dir, seed, engine);
    let timeline = Timeline::new(&rec.events);
    let oracle = Oracle::new(&timeline, &rec.initial);
    for k in 0..images {
        let mut rng = Rng::scrambled(seed.wrapping_mul(1_000_003).wrapping_add(k as u64));
        let (barrier, c) = timeline.pick_crash(&mut rng);
        let img = timeline.crash_image(&rec.start, rec.final_len, c, &mut rng);
        let reader = if k % 4 == 0 {
            Reader::OursAndQemu
        } else {
            Reader::Ours
        };
        match check_crash_image(dir.path(), &img, &oracle, c, reader) {
            Ok(must) => tally.durable_sectors += must,
            Err(e) => {
                keep_failure(dir.path(), &rec, seed, k);
                panic!(
                "seed {seed} ({cfg:?}), crash image {k}: crash at log position {c} of {} after \
                 barrier {barrier:?} ({} durable writes, {} of {} others kept): {e}\n\
                 replay with REPLAY_SEED={seed}",
                timeline.len, img.durable, img.kept, img.maybe
            )
            }
        }
        tally.images += 1;
    }
    tally.runs += 1;
}

/// With REPLAY_KEEP=DIR, a failing crash image and the run's log (one
/// event per line) are copied to DIR for inspection.
fn keep_failure(dir: &Path, rec: &Recording, seed: u64, k: usize) {
    let Ok(keep) = std::env::var("REPLAY_KEEP") else {
        return;
    };
    let keep = Path::new(&keep);
    let _ = std::fs::create_dir_all(keep);
    let _ = std::fs::copy(
        dir.join("crash.qcow2"),
        keep.join(format!("seed{seed}-image{k}.qcow2")),
    );
    let text: String = rec
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{i} {}\n", replay_support::record::describe(e)))
        .collect();
    let _ = std::fs::write(keep.join(format!("seed{seed}.log")), text);
    eprintln!("kept the crash image and the log in {}", keep.display());
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

/// Runs enough recorded runs on `engine` for `default` crash images (or
/// REPLAY_CRASH_IMAGES), seeds from `first_seed` by `stride`; prints the
/// tally.
fn replay(engine: EngineKind, first_seed: u64, stride: u64, default: usize) {
    let t0 = Instant::now();
    let mut tally = Tally::default();
    if let Some(seed) = env_number("REPLAY_SEED") {
        replay_run(seed, engine, IMAGES_PER_RUN, &mut tally);
    } else {
        let want = env_number("REPLAY_CRASH_IMAGES").map_or(default, |n| n as usize);
        let mut seed = first_seed;
        while tally.images < want {
            let n = IMAGES_PER_RUN.min(want - tally.images);
            replay_run(seed, engine, n, &mut tally);
            seed += stride;
        }
    }
    eprintln!(
        "replay {engine:?}: {} runs, {} crash images, corruptions 0, lost acknowledged writes 0 \
         ({} sectors had to hold flushed data), {:.1} s",
        tally.runs,
        tally.images,
        tally.durable_sectors,
        t0.elapsed().as_secs_f64()
    );
    assert!(tally.images > 0);
}

#[test]
fn crash_images_from_sync_engine_runs() {
    // Seeds 0..8: every cluster size x queue count x backing file.
    replay(EngineKind::Sync, 0, 1, 200);
}

#[test]
fn crash_images_from_io_uring_runs() {
    if !testkit::available("io_uring", block::io::probe::uring_support()) {
        return;
    }
    // Seeds 0, 3, 6, 9 (+2^20): both cluster sizes and queue counts.
    replay(EngineKind::IoUring, 1 << 20, 3, 100);
}

/// Runs that once found a durability bug, replayed as they were.
/// Seed 24 (4 KiB clusters, snapshots, lazy refcounts, O_DIRECT, one
/// queue): copying an L2 table shared with a snapshot dropped the old
/// table's refcount before the L1 entry naming the copy was durable;
/// crash image 5 (after barrier 8) had the L1 entry still on the old
/// table with refcount 1 and two references (qemu-img check: "refcount=1
/// reference=2", "OFLAG_COPIED L2 cluster").
/// Seed 53 (64 KiB clusters, raw backing file, one queue): write-zeroes
/// without unmap flagged a just-allocated cluster zero with a
/// write-through L2 entry, with no barrier after the cluster's refcount
/// write; crash image 21 (after barrier 3) had the entry and refcount 0
/// ("refcount=0 reference=1", "OFLAG_COPIED data cluster").
/// Seed 5 (512-byte clusters, 64-bit refcounts, raw backing file, one
/// queue): six refcount blocks added at once, the last of which counts
/// all six, were linked into the table by separate unordered writes;
/// crash image 7 (after barrier 184) named blocks whose own refcount
/// lay in the block not yet named ("refcount=0 reference=1").
#[test]
fn crash_images_of_past_failures() {
    let mut tally = Tally::default();
    for seed in [5, 24, 53] {
        replay_run(seed, EngineKind::Sync, IMAGES_PER_RUN, &mut tally);
    }
}

/// The method can fail: with the fdatasyncs of the guest FLUSHes left out
/// of the log, crash images right after a FLUSH lose acknowledged writes
/// (overwrites of allocated clusters need no metadata barrier), and the
/// oracle says so.
#[test]
fn dropping_the_flush_barriers_loses_acknowledged_writes() {
    let dir = temp_dir("replay-nobarrier");
    // 4 KiB clusters, 1 queue, no backing file: seed 0.
    let (_, rec) = record(&dir, 0, EngineKind::Sync);
    let mut timeline = Timeline::new(&rec.events);
    let before = timeline.barriers.len();
    timeline.barriers.retain(|b| !b.engine);
    assert!(timeline.barriers.len() < before, "the run has no FLUSH");
    let oracle = Oracle::new(&timeline, &rec.initial);
    let mut lost = 0;
    for k in 0..40u64 {
        let mut rng = Rng::scrambled(k);
        // Right after a random completed guest FLUSH.
        let flushes: Vec<usize> = timeline
            .guest
            .iter()
            .filter(|r| matches!(r.op, replay_support::record::GuestOp::Flush))
            .filter_map(|r| r.done)
            .collect();
        let c = flushes[rng.below(flushes.len() as u64) as usize] + 1;
        let img = timeline.crash_image(&rec.start, rec.final_len, c, &mut rng);
        if let Err(e) = check_crash_image(dir.path(), &img, &oracle, c, Reader::Ours) {
            eprintln!("caught, as it should be: {e}");
            lost += 1;
        }
    }
    assert!(lost > 0, "no crash image lost a write without its barrier");
}
