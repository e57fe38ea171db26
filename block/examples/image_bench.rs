//! Read throughput and latency of our `DiskQueue` on raw, fully allocated
//! qcow2, and zlib/zstd-compressed qcow2 images of the same data, beside
//! fio's io_uring engine on the raw file (the limit). Prints a table of
//! medians over interleaved rounds; not a test.
//!
//! Usage: cargo run --release -p block --example image_bench -- \
//!        [WORKLOAD] [CASES] [SECONDS] [ROUNDS] [ENGINE]
//! WORKLOAD: rand4k32 (4 KiB random, QD 32), rand4k1 (QD 1), seq4k32
//! (4 KiB sequential, QD 32) or seq1m8 (1 MiB sequential, QD 8). CASES: comma-separated of raw, qcow2, zlib,
//! zstd. ENGINE: io_uring (default) or sync. Always O_DIRECT. Images live
//! in /var/tmp/image_bench (created on first use, 256 MiB, about 2:1
//! compressible, qcow2 with 64 KiB clusters).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::request::GuestSegment;
use block::{BlockRequest, Disk, DiskOptions, EngineKind, ImageType, IoMemory, RequestOp};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const DIR: &str = "/var/tmp/image_bench";
const SIZE: u64 = 256 << 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Clone, Copy)]
struct Workload {
    bs: u64,
    qd: usize,
    random: bool,
}

fn workload(name: &str) -> Workload {
    match name {
        "rand4k1" => Workload {
            bs: 4096,
            qd: 1,
            random: true,
        },
        "seq4k32" => Workload {
            bs: 4096,
            qd: 32,
            random: false,
        },
        "seq1m8" => Workload {
            bs: 1 << 20,
            qd: 8,
            random: false,
        },
        _ => Workload {
            bs: 4096,
            qd: 32,
            random: true,
        },
    }
}

fn run(cmd: &mut Command) {
    let st = cmd.status().expect("run qemu-img");
    assert!(st.success(), "{cmd:?} failed");
}

/// Creates the raw file and the images converted from it, if missing.
fn prepare(case: &str) -> String {
    std::fs::create_dir_all(DIR).expect("bench dir");
    let raw = format!("{DIR}/data.raw");
    if std::fs::metadata(&raw).map(|m| m.len()).unwrap_or(0) != SIZE {
        let mut f = std::fs::File::create(&raw).expect("create raw");
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut block = vec![0u8; 4096];
        for _ in 0..SIZE / 4096 {
            // Half random, half text: about 2:1 for zlib and zstd.
            for b in block[..2048].iter_mut() {
                *b = rng.next() as u8;
            }
            for (i, b) in block[2048..].iter_mut().enumerate() {
                *b = b"the quick brown fox jumps over the lazy dog "[i % 44];
            }
            f.write_all(&block).expect("fill raw");
        }
        f.sync_all().expect("sync raw");
    }
    let (path, extra): (String, &[&str]) = match case {
        "raw" => return raw,
        "qcow2" => (format!("{DIR}/alloc.qcow2"), &[]),
        "zlib" => (format!("{DIR}/zlib.qcow2"), &["-c"]),
        _ => (
            format!("{DIR}/zstd.qcow2"),
            &["-c", "-o", "compression_type=zstd"],
        ),
    };
    if !Path::new(&path).exists() {
        let tmp = format!("{path}.tmp");
        run(Command::new("qemu-img")
            .args(["convert", "-O", "qcow2", "-o", "cluster_size=65536"])
            .args(extra)
            .args([&raw, &tmp]));
        std::fs::rename(&tmp, &path).expect("rename image");
    }
    path
}

/// Returns (IOPS, mean latency in microseconds).
fn ours(path: &str, case: &str, engine: EngineKind, secs: u64, w: Workload) -> (f64, f64) {
    let mut o = DiskOptions::new(path);
    o.direct = true;
    o.engine = engine;
    o.image_type = if case == "raw" {
        ImageType::RAW
    } else {
        ImageType::Format("qcow2")
    };
    o.lock = false;
    o.readonly = true;
    let disk = Disk::open(&o).expect("open");
    let mut q = disk.queue().expect("queue");
    let mem = Arc::new(
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), w.qd * w.bs as usize)])
            .expect("memory"),
    );
    let blocks = disk.size() / w.bs;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cursor = 0u64;
    let mut started = vec![Instant::now(); w.qd];
    let mut req = |slot: usize| {
        let block = if w.random {
            rng.next() % blocks
        } else {
            cursor = (cursor + 1) % blocks;
            cursor
        };
        BlockRequest {
            user_data: slot as u64,
            op: RequestOp::Read,
            offset: block * w.bs,
            memory: IoMemory::guest(
                mem.clone(),
                vec![GuestSegment {
                    addr: GuestAddress(slot as u64 * w.bs),
                    len: w.bs as u32,
                }],
            )
            .expect("segment"),
        }
    };
    let t0 = Instant::now();
    q.submit_batch_requests((0..w.qd).map(&mut req).collect::<Vec<_>>());
    let (mut ios, mut lat) = (0u64, Duration::ZERO);
    let mut out = Vec::new();
    let mut next = Vec::with_capacity(w.qd);
    let end = t0 + Duration::from_secs(secs);
    while Instant::now() < end {
        q.wait_completions(&mut out).expect("wait");
        for c in out.drain(..) {
            c.result.expect("read");
            let slot = c.user_data as usize;
            lat += started[slot].elapsed();
            ios += 1;
            started[slot] = Instant::now();
            next.push(req(slot));
        }
        q.submit_batch_requests(next.drain(..));
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

fn fio(path: &str, secs: u64, w: Workload) -> Option<(f64, f64)> {
    let out = Command::new("fio")
        .args([
            "--name=bench",
            &format!("--filename={path}"),
            "--ioengine=io_uring",
            "--direct=1",
            if w.random {
                "--rw=randread"
            } else {
                "--rw=read"
            },
            &format!("--bs={}", w.bs),
            &format!("--iodepth={}", w.qd),
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
    let wname = args.get(1).map(String::as_str).unwrap_or("rand4k32");
    let w = workload(wname);
    let cases: Vec<String> = args
        .get(2)
        .map(String::as_str)
        .unwrap_or("raw,qcow2,zlib,zstd")
        .split(',')
        .map(String::from)
        .collect();
    let secs: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let rounds: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3);
    let engine = match args.get(5).map(String::as_str) {
        Some("sync") => EngineKind::Sync,
        _ => EngineKind::IoUring,
    };
    let raw = prepare("raw");
    let paths: Vec<String> = cases.iter().map(|c| prepare(c)).collect();
    let mut rows: Vec<(String, Vec<(f64, f64)>)> = cases
        .iter()
        .map(|c| (format!("ours {c}"), vec![]))
        .collect();
    rows.push(("fio raw".into(), vec![]));
    let last = rows.len() - 1;
    // Interleaved rounds: the machine is noisy.
    for _ in 0..rounds {
        for (i, case) in cases.iter().enumerate() {
            let r = ours(&paths[i], case, engine, secs, w);
            rows[i].1.push(r);
        }
        if let Some(r) = fio(&raw, secs, w) {
            rows[last].1.push(r);
        }
    }
    println!(
        "{wname}: bs {} QD {} {}, O_DIRECT, {engine:?}, {secs} s x {rounds} rounds",
        w.bs,
        w.qd,
        if w.random { "random" } else { "sequential" }
    );
    println!(
        "{:<12} {:>12} {:>14} {:>8} {:>10}",
        "case", "median IOPS", "mean lat (us)", "vs fio", "lat/fio"
    );
    let median = |v: &mut Vec<(f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v.get(v.len() / 2).copied()
    };
    let fio_median = median(&mut rows[last].1.clone());
    for (name, mut v) in rows {
        match median(&mut v) {
            Some((iops, lat)) => {
                let (ratio, lratio) = fio_median
                    .map(|f| (format!("{:.2}", iops / f.0), format!("{:.2}", lat / f.1)))
                    .unwrap_or_else(|| ("-".into(), "-".into()));
                println!("{name:<12} {iops:>12.0} {lat:>14.1} {ratio:>8} {lratio:>10}");
            }
            None => println!("{name:<12} {:>12}", "n/a"),
        }
    }
}
