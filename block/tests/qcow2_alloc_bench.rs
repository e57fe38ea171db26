//! Benchmark (ignored; prints a table, asserts nothing about time):
//! allocating sequential 64 KiB writes at queue depth 32 into fresh,
//! empty images (preallocation=off), through our `DiskQueue` (io_uring,
//! O_DIRECT, page-aligned guest memory as a VMM has) beside
//! `qemu-img bench -w -i io_uring -t none -d 32 -s 64k` on the same kind
//! of image, qcow2 and sparse raw, interleaved, medians of the rounds.
//!
//! cargo test -p block --release --test qcow2_alloc_bench -- --ignored --nocapture
//! (QCOW2_BENCH_ROUNDS, QCOW2_BENCH_COUNT override 5 rounds of 4096 writes.)

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use block::request::GuestSegment;
use block::{BlockRequest, Disk, DiskOptions, EngineKind, ImageType, IoMemory, RequestOp};
use support::{qemu_create, temp_dir};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const BS: u64 = 64 << 10;
const QD: usize = 32;
const IMAGE: u64 = 2 << 30;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fresh(p: &Path, qcow2: bool) {
    let _ = std::fs::remove_file(p);
    let fmt = if qcow2 { "qcow2" } else { "raw" };
    qemu_create(
        fmt,
        p.to_str().unwrap(),
        &IMAGE.to_string(),
        "preallocation=off",
    );
}

/// Seconds for `count` sequential writes with `QD` in flight.
fn ours(p: &Path, qcow2: bool, count: u64) -> f64 {
    let mut o = DiskOptions::new(p);
    o.direct = true;
    o.engine = EngineKind::IoUring;
    o.image_type = if qcow2 {
        ImageType::Format("qcow2")
    } else {
        ImageType::RAW
    };
    o.lock = false;
    let disk = Disk::open(&o).expect("open");
    let mut q = disk.queue().expect("queue");
    let mem = Arc::new(
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), QD * BS as usize)]).expect("memory"),
    );
    let mut next_block = 0u64;
    let mut req = |slot: usize| {
        let offset = next_block * BS;
        next_block += 1;
        BlockRequest {
            user_data: slot as u64,
            op: RequestOp::Write,
            offset,
            memory: IoMemory::guest(
                mem.clone(),
                vec![GuestSegment {
                    addr: GuestAddress(slot as u64 * BS),
                    len: BS as u32,
                }],
            )
            .expect("segment"),
        }
    };
    let t0 = Instant::now();
    let first = (QD as u64).min(count);
    q.submit_batch_requests((0..first as usize).map(&mut req).collect::<Vec<_>>());
    let mut submitted = first;
    let mut out = Vec::new();
    let mut next = Vec::with_capacity(QD);
    while q.in_flight() > 0 {
        q.wait_completions(&mut out).expect("wait");
        for c in out.drain(..) {
            c.result.expect("write");
            if submitted < count {
                submitted += 1;
                next.push(req(c.user_data as usize));
            }
        }
        q.submit_batch_requests(next.drain(..));
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(q);
    disk.close().expect("close");
    secs
}

fn qemu(p: &Path, qcow2: bool, count: u64) -> f64 {
    let out = testkit::output_within(
        Command::new("qemu-img")
            .args(["bench", "-w", "-i", "io_uring", "-t", "none", "-d", "32"])
            .args(["-s", "64k", "-c", &count.to_string()])
            .args(["-f", if qcow2 { "qcow2" } else { "raw" }])
            .arg(p),
        testkit::COMMAND_LIMIT,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("Run completed in ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: prints a table"]
fn allocating_sequential_64k_writes_at_qd32() {
    let rounds = env("QCOW2_BENCH_ROUNDS", 5).max(1);
    let count = env("QCOW2_BENCH_COUNT", 4096).max(1);
    let d = temp_dir("allocbench");
    let (a, b) = (d.join("a.img"), d.join("b.img"));
    println!(
        "{count} x 64 KiB sequential writes, QD {QD}, fresh {IMAGE}-byte images, {rounds} rounds"
    );
    println!(
        "{:<6} {:>10} {:>10} {:>8}",
        "image", "ours s", "qemu s", "qemu/ours"
    );
    for qcow2 in [true, false] {
        let (mut o, mut q) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            fresh(&a, qcow2);
            fresh(&b, qcow2);
            q.push(qemu(&a, qcow2, count));
            o.push(ours(&b, qcow2, count));
            if qcow2 {
                support::qemu_check(&b);
            }
        }
        let (mo, mq) = (median(&mut o), median(&mut q));
        println!(
            "{:<6} {:>10.3} {:>10.3} {:>8.2}    ours {o:.3?} qemu {q:.3?}",
            if qcow2 { "qcow2" } else { "raw" },
            mo,
            mq,
            mq / mo
        );
    }
}
