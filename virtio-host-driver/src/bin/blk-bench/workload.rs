//! Our side of a benchmark: the real device driven by one driver thread
//! per queue through [`virtio_host_driver`].
//!
//! Data enters as [`Options`]; each driver thread keeps `qd` requests in
//! flight (or, with think time, posts batches and "thinks" before each
//! batch and after each completion, like a guest doing work between I/Os).
//! It leaves as [`RunStats`] over every completed request.

use std::time::{Duration, Instant};

use block::{Disk, DiskOptions};
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use virtio_devices::block::BlockDeviceConfig;
use virtio_host_driver::{BlockHarness, DriverOptions, QueueDriver};

use crate::args::Options;
use crate::stats::{RunCpu, RunStats};
use crate::thread_cpu::{CpuSnapshot, CpuSplit, ThreadCpu, WORKER_PREFIX};

/// What one driver thread measured.
struct ThreadResult {
    lat_ns: Vec<u64>,
    bytes: u64,
    think: Duration,
    errors: u64,
    /// This driver thread's CPU time and context switches, read when it
    /// finished.
    cpu: Option<ThreadCpu>,
}

#[derive(Clone, Copy)]
struct ThreadPlan {
    queue: u16,
    queues: u16,
    blocks: u64,
    bs: u32,
    write: bool,
    random: bool,
    runtime: Duration,
    max_ops: Option<u64>,
    think: Duration,
    batch: u16,
}

/// xorshift64*: cheap, and each queue gets its own sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn think(d: Duration, total: &mut Duration) {
    if d.is_zero() {
        return;
    }
    let t = Instant::now();
    std::thread::sleep(d);
    *total += t.elapsed();
}

fn drive(mut q: QueueDriver, p: ThreadPlan) -> ThreadResult {
    let mut rng =
        Rng(0x9e37_79b9_7f4a_7c15 ^ (u64::from(p.queue) + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let mut cursor = p.blocks * u64::from(p.queue) / u64::from(p.queues);
    let request_type = if p.write {
        VIRTIO_BLK_T_OUT
    } else {
        VIRTIO_BLK_T_IN
    };
    if p.write {
        let pattern: Vec<u8> = (0..p.bs).map(|i| (i % 251) as u8).collect();
        for s in 0..q.slots() {
            q.write_data(s, &pattern);
        }
    }
    let sectors_per_block = u64::from(p.bs / 512);
    let mut posted_at = vec![Instant::now(); q.slots()];
    let mut res = ThreadResult {
        lat_ns: Vec::with_capacity(1 << 16),
        bytes: 0,
        think: Duration::ZERO,
        errors: 0,
        cpu: None,
    };
    let start = Instant::now();
    let deadline = start + p.runtime;
    let mut issued = 0u64;
    let mut in_flight = 0usize;
    let mut done = Vec::new();
    let think_mode = !p.think.is_zero();
    loop {
        let may_issue = |issued: u64| match p.max_ops {
            Some(m) => issued < m,
            None => Instant::now() < deadline,
        };
        let mut to_post = 0usize;
        if think_mode {
            if in_flight == 0 {
                if !may_issue(issued) {
                    break;
                }
                think(p.think, &mut res.think);
                to_post = usize::from(p.batch);
            }
        } else if may_issue(issued) {
            to_post = q.free_slots();
        }
        let mut posted = 0;
        while posted < to_post && p.max_ops.is_none_or(|m| issued < m) {
            let block = if p.random {
                rng.next() % p.blocks
            } else {
                let b = cursor;
                cursor = (cursor + 1) % p.blocks;
                b
            };
            let Some(slot) = q.post(request_type, block * sectors_per_block, p.bs) else {
                break;
            };
            posted_at[slot] = Instant::now();
            posted += 1;
            issued += 1;
        }
        if posted > 0 {
            in_flight += posted;
            if q.kick().is_err() {
                res.errors += 1;
                break;
            }
        }
        if in_flight == 0 {
            break;
        }
        if q.wait(Duration::from_secs(10), &mut done).unwrap_or(0) == 0 {
            eprintln!(
                "blk-bench: queue {} stalled with {in_flight} requests in flight",
                p.queue
            );
            res.errors += 1;
            break;
        }
        let now = Instant::now();
        for u in done.drain(..) {
            in_flight -= 1;
            if u.status != VIRTIO_BLK_S_OK as u8 {
                res.errors += 1;
            }
            if let Some(t) = posted_at.get(u.slot) {
                res.lat_ns.push(now.duration_since(*t).as_nanos() as u64);
            }
            res.bytes += u64::from(p.bs);
            if think_mode {
                think(p.think, &mut res.think);
            }
        }
    }
    res.cpu = ThreadCpu::current();
    res
}

/// Runs the workload once through the real device.
pub fn run_ours(o: &Options) -> Result<RunStats, String> {
    let mut dopts = DiskOptions::new(&o.image);
    dopts.image_type = o.format;
    dopts.engine = o.engine;
    dopts.direct = o.direct;
    dopts.readonly = !o.rw.is_write();
    let disk = Disk::open(&dopts).map_err(|e| format!("cannot open {}: {e}", o.image.display()))?;
    if let Some(granularity) = o.bitmap {
        disk.live()
            .bitmaps()
            .add("blk-bench", granularity, false, false)
            .map_err(|e| format!("--bitmap: {e}"))?;
    }
    let blocks = disk.size() / u64::from(o.bs);
    if blocks == 0 {
        return Err("--bs is larger than the image".into());
    }
    if o.qd > o.queue_size {
        return Err(format!(
            "--qd {} exceeds --queue-size {}",
            o.qd, o.queue_size
        ));
    }
    let config = BlockDeviceConfig {
        num_queues: o.queues,
        queue_size: o.queue_size,
        poll_us: o.poll_us,
        ..Default::default()
    };
    let driver = DriverOptions {
        event_idx: true,
        indirect: u32::from(o.qd) * 3 > u32::from(o.queue_size),
        slots: o.qd,
        slot_data: o.bs,
        scratch: 0,
        halt_poll: Duration::from_micros(u64::from(o.halt_poll_us)),
    };
    let mut h =
        BlockHarness::new(disk, config, driver).map_err(|e| format!("device setup: {e}"))?;
    let plan = |queue| ThreadPlan {
        queue,
        queues: o.queues,
        blocks,
        bs: o.bs,
        write: o.rw.is_write(),
        random: o.rw.is_random(),
        runtime: Duration::from_secs_f64(o.runtime_s),
        max_ops: o.io_size.map(|b| b.div_ceil(u64::from(o.bs))),
        think: Duration::from_micros(o.think_us),
        batch: o.batch,
    };
    let drivers: Vec<_> = (0..o.queues)
        .filter_map(|i| h.take_queue(i).map(|q| (i, q)))
        .collect();
    let cpu_before = CpuSnapshot::take();
    let t0 = Instant::now();
    let threads: Vec<_> = drivers
        .into_iter()
        .map(|(i, q)| {
            let p = plan(i);
            std::thread::Builder::new()
                .name(format!("blk-bench-q{i}"))
                .spawn(move || drive(q, p))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot start driver threads: {e}"))?;
    let mut lat = Vec::new();
    let mut bytes = 0;
    let mut think_s = 0.0f64;
    let mut errors = 0;
    let mut cpu = Vec::new();
    for t in threads {
        let r = t
            .join()
            .map_err(|_| "a driver thread panicked".to_string())?;
        lat.extend(r.lat_ns);
        bytes += r.bytes;
        think_s = think_s.max(r.think.as_secs_f64());
        errors += r.errors;
        cpu.extend(r.cpu);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    // The whole process and the device's queue workers (named by
    // BlockDevice), before they stop.
    let cpu_after = CpuSnapshot::take();
    let split = CpuSplit::between(&cpu_before, &cpu_after, &cpu);
    cpu.extend(ThreadCpu::named(WORKER_PREFIX));
    h.device
        .close()
        .map_err(|e| format!("closing the device: {e}"))?;
    if errors > 0 {
        return Err(format!("{errors} requests failed or stalled"));
    }
    let mut stats = RunStats::from_latencies("blk-bench", &mut lat, bytes, elapsed, think_s);
    stats.threads = cpu;
    stats.cpu = RunCpu::Split(split);
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::parse;

    fn image(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("blk-bench-{tag}-{}.raw", std::process::id()));
        std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
        p
    }

    fn options(image: &std::path::Path, extra: &str) -> Options {
        let mut args = vec!["--image".to_string(), image.display().to_string()];
        args.extend(
            "--engine sync --direct off"
                .split_whitespace()
                .map(String::from),
        );
        args.extend(extra.split_whitespace().map(String::from));
        parse(&args).unwrap().unwrap()
    }

    #[test]
    fn fixed_io_size_runs_exactly_that_many_requests() {
        let img = image("fixed");
        for (extra, ops) in [
            ("--qd 4 --bs 4k --io-size 64k --rw randread", 16),
            ("--qd 2 --queues 2 --bs 8k --io-size 32k --rw write", 8),
            (
                "--qd 4 --batch 2 --think-us 100 --bs 4k --io-size 32k --rw read",
                8,
            ),
        ] {
            let s = run_ours(&options(&img, extra)).unwrap();
            assert_eq!(s.ops, ops, "{extra}");
            assert!(s.lat_p99_us >= s.lat_p50_us, "{extra}");
            if extra.contains("think") {
                // 1 sleep before each of 4 batches + 1 after each of 8 completions.
                assert!(s.think_s >= 12.0 * 100e-6, "{extra}: think {}", s.think_s);
            }
        }
        std::fs::remove_file(&img).unwrap();
    }
}
