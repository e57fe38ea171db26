//! 4 KiB random reads at a fixed queue depth with O_DIRECT on a raw file:
//! our `DiskQueue` (io_uring and sync engines) beside fio's io_uring
//! engine on the same file. Prints a table; not a test.
//!
//! Usage: cargo run --release -p block --example queue_bench -- \
//!        [FILE] [SECONDS] [QD] [ROUNDS]
//! FILE is created (256 MiB, filled) if missing.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::request::GuestSegment;
use block::{BlockRequest, Disk, DiskOptions, EngineKind, ImageType, IoMemory, RequestOp};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const BS: u64 = 4096;
const FILE_SIZE: u64 = 256 << 20;

fn prepare(path: &str) {
    if std::fs::metadata(path)
        .map(|m| m.len() >= FILE_SIZE)
        .unwrap_or(false)
    {
        return;
    }
    let mut f = std::fs::File::create(path).expect("create bench file");
    let chunk: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    for _ in 0..FILE_SIZE >> 20 {
        f.write_all(&chunk).expect("fill bench file");
    }
    f.sync_all().expect("sync bench file");
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Returns (IOPS, mean latency in microseconds).
fn ours(path: &str, engine: EngineKind, secs: u64, qd: usize) -> (f64, f64) {
    let mut o = DiskOptions::new(path);
    o.direct = true;
    o.engine = engine;
    o.image_type = ImageType::Raw;
    o.lock = false;
    let disk = Disk::open(&o).expect("open");
    let mut q = disk.queue().expect("queue");
    let mem = Arc::new(
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), qd * BS as usize)]).expect("memory"),
    );
    let blocks = disk.size() / BS;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut started = vec![Instant::now(); qd];
    let req = |slot: usize, rng: &mut Rng| BlockRequest {
        user_data: slot as u64,
        op: RequestOp::Read,
        offset: (rng.next() % blocks) * BS,
        memory: IoMemory::guest(
            mem.clone(),
            vec![GuestSegment {
                addr: GuestAddress(slot as u64 * BS),
                len: BS as u32,
            }],
        )
        .expect("segment"),
    };
    let t0 = Instant::now();
    q.submit_batch_requests((0..qd).map(|s| req(s, &mut rng)).collect::<Vec<_>>());
    let (mut ios, mut lat) = (0u64, Duration::ZERO);
    let mut out = Vec::new();
    let end = t0 + Duration::from_secs(secs);
    while Instant::now() < end {
        q.wait_completions(&mut out).expect("wait");
        let mut next = Vec::with_capacity(out.len());
        for c in out.drain(..) {
            c.result.expect("read");
            let slot = c.user_data as usize;
            lat += started[slot].elapsed();
            ios += 1;
            started[slot] = Instant::now();
            next.push(req(slot, &mut rng));
        }
        q.submit_batch_requests(next);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    while q.in_flight() > 0 {
        q.wait_completions(&mut out).expect("wait");
        out.clear();
    }
    (
        ios as f64 / elapsed,
        lat.as_secs_f64() * 1e6 / ios.max(1) as f64,
    )
}

fn fio(path: &str, secs: u64, qd: usize) -> Option<(f64, f64)> {
    let out = Command::new("fio")
        .args([
            "--name=bench",
            &format!("--filename={path}"),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randread",
            "--bs=4k",
            &format!("--iodepth={qd}"),
            "--numjobs=1",
            "--time_based",
            &format!("--runtime={secs}"),
            "--output-format=terse",
            "--terse-version=3",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.lines().last()?.split(';').collect();
    // terse v3: field 8 is read IOPS, field 40 the mean completion latency (usec).
    Some((f.get(7)?.parse().ok()?, f.get(39)?.parse().ok()?))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "/var/tmp/queue_bench.raw".into());
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let qd: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(32);
    let rounds: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    prepare(&path);
    let mut rows: Vec<(&str, Vec<(f64, f64)>)> = vec![
        ("ours io_uring", vec![]),
        ("ours sync", vec![]),
        ("fio io_uring", vec![]),
    ];
    // Interleaved rounds: the machine is noisy.
    for _ in 0..rounds {
        rows[0].1.push(ours(&path, EngineKind::IoUring, secs, qd));
        rows[1].1.push(ours(&path, EngineKind::Sync, secs, qd));
        if let Some(r) = fio(&path, secs, qd) {
            rows[2].1.push(r);
        }
    }
    println!("4 KiB random read, O_DIRECT, QD {qd}, {secs} s x {rounds} rounds, file {path}");
    println!(
        "{:<14} {:>12} {:>14} {:>12}",
        "engine", "median IOPS", "mean lat (us)", "vs fio"
    );
    let median = |v: &mut Vec<(f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v.get(v.len() / 2).copied()
    };
    let fio_median = median(&mut rows[2].1.clone()).map(|r| r.0);
    for (name, mut v) in rows {
        match median(&mut v) {
            Some((iops, lat)) => {
                let ratio = fio_median
                    .map(|f| format!("{:.2}", iops / f))
                    .unwrap_or_else(|| "-".into());
                println!("{name:<14} {iops:>12.0} {lat:>14.1} {ratio:>12}");
            }
            None => println!("{name:<14} {:>12}", "n/a"),
        }
    }
}
