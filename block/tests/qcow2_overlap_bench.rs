//! Benchmark (ignored; prints a table, asserts nothing about time): what
//! the metadata overlap checks cost the planning of a write. In-place
//! 4 KiB writes at random offsets of a metadata-preallocated image (every
//! L2 table present, so the metadata map is large) are planned without
//! running their data I/O, with the checks on and off
//! (`Qcow2Image::set_overlap_checks`), interleaved, medians of the rounds.
//!
//! cargo test -p block --release --test qcow2_overlap_bench -- --ignored --nocapture
//! (OVERLAP_BENCH_SIZE in GiB, default 8; OVERLAP_BENCH_PLANS, default
//! 200000; OVERLAP_BENCH_ROUNDS, default 5.)

mod support;

use std::time::Instant;

use block::formats::qcow2::{open_qcow2, Qcow2Image};
use block::formats::{Format, WriteOutcome};
use block::options::DiskOptions;
use support::*;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Plans per second of `plans` random in-place 4 KiB writes.
fn plans_per_second(img: &Qcow2Image, size: u64, plans: u64, seed: u64) -> f64 {
    let w = waker();
    let mut rng = Rng::new(seed);
    let t = Instant::now();
    for _ in 0..plans {
        let off = rng.below(size / 4096) * 4096;
        match img.plan_write(off, 4096, &w).expect("plan") {
            WriteOutcome::Ready(p) => assert!(p.commit.is_none(), "in place"),
            WriteOutcome::Blocked => panic!("nothing is in flight"),
        }
    }
    plans as f64 / t.elapsed().as_secs_f64()
}

#[test]
#[ignore = "benchmark: prints a table"]
fn overlap_check_cost_per_planned_write() {
    let gib = env("OVERLAP_BENCH_SIZE", 8);
    let plans = env("OVERLAP_BENCH_PLANS", 200_000);
    let rounds = env("OVERLAP_BENCH_ROUNDS", 5);
    let size = gib << 30;
    let d = temp_dir("overlap-bench");
    let p = d.join("b.qcow2");
    qemu_create(
        "qcow2",
        s(&p),
        &size.to_string(),
        "cluster_size=4096,preallocation=metadata",
    );
    let mut o = DiskOptions::new(&p);
    o.lock = false;
    let file = block::formats::open::open_file(&o).unwrap();
    let img = open_qcow2(&o, file, &block::formats::FORMATS).unwrap();
    // Warm-up: every L2 table the writes need is cached before timing.
    plans_per_second(&img, size, plans, 0);
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        img.set_overlap_checks(true);
        on.push(plans_per_second(&img, size, plans, round + 1));
        img.set_overlap_checks(false);
        off.push(plans_per_second(&img, size, plans, round + 1));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (on, off) = (median(&mut on), median(&mut off));
    println!("{gib} GiB image, 4 KiB clusters, metadata preallocated, {plans} plans per round, median of {rounds}");
    println!("| overlap checks | planned in-place 4 KiB writes/s | ns per plan |");
    println!("| --- | --- | --- |");
    println!("| on | {on:.0} | {:.0} |", 1e9 / on);
    println!("| off | {off:.0} | {:.0} |", 1e9 / off);
    img.close().unwrap();
}
