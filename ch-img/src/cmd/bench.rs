//! `ch-img bench`: qemu-img bench's options and output, driving a
//! [`block::DiskQueue`] the way a virtio queue worker does.
//!
//! `depth` requests stay in flight: each loop fills the queue up to the
//! depth with one `submit_batch_requests`, waits for the queue's
//! completion eventfd (poll), drains the completions and records each
//! request's latency in a bounded histogram. Options enter from the command
//! line; qemu-img bench's two lines (or one JSON object) leave on stdout.
//!
//! `-t` as in qemu-img: `none`/`directsync` open with O_DIRECT; in
//! `writethrough`/`directsync` a write completes (and its latency ends)
//! only after a flush that follows it; `unsafe` drops the
//! `--flush-interval` flushes and the sync at close.
//!
//! Extensions over qemu-img: `--random` (uniform, size-aligned offsets;
//! `--seed N`), `--rw-mix=READ_PERCENT`, `--output=json`, and `-i sync`.

use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

use block::aligned::AlignedBuf;
use block::options::CacheMode;
use block::{BlockRequest, Disk, DiskOptions, EngineKind, IoMemory, RequestOp};
use serde_json::json;

use crate::args::{parse, OptSpec};
use crate::cmd::{print_json, OutputFormat};
use crate::error::CliError;
use crate::options::{open_error, parse_cache, parse_format, CacheFlag};
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "cdfiostST",
    short_flags: "nqwUh",
    long_with_value: &["pattern", "flush-interval", "seed", "rw-mix", "output"],
    long_flags: &["no-drain", "random", "force-share"],
};

/// Marks the flush requests bench adds between data requests.
const FLUSH_TAG: u64 = u64::MAX;
/// Tags of the flush that completes a slot's write in writethrough and
/// directsync modes (slot number added).
const SYNC_TAG_BASE: u64 = 1 << 62;
/// Latency histogram: 1 µs buckets up to 100 ms, then one overflow bucket.
const HIST_BUCKETS: usize = 100_000;

/// What to run, from the command line.
#[derive(Debug, Clone)]
struct BenchParams {
    count: u64,
    depth: usize,
    size: u64,
    step: u64,
    offset: u64,
    read_percent: u64,
    pattern: u8,
    flush_interval: u64,
    drain: bool,
    random: bool,
    seed: u64,
    direct: bool,
    cache: CacheMode,
    engine: EngineKind,
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let output = OutputFormat::parse(p.value("output"))?;
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let params = params(&p)?;
    let mut opts = DiskOptions::new(path);
    opts.image_type = parse_format(p.value("f"))?;
    opts.readonly = params.read_percent == 100;
    opts.force_share = crate::options::force_share(&p);
    if !opts.readonly {
        crate::options::refuse_force_share(path, opts.force_share)?;
    }
    opts.direct = params.direct;
    opts.engine = params.engine;
    let disk = Disk::open(&opts).map_err(|source| open_error(path, params.cache, source))?;
    if params.size > disk.size() {
        return Err(CliError::Usage(format!(
            "request size {} is larger than the image ({} bytes)",
            params.size,
            disk.size()
        )));
    }
    if output == OutputFormat::Human {
        print_header(&params);
    }
    let result = drive(&disk, &params)?;
    if !opts.readonly && params.cache.flushes() {
        disk.close().map_err(CliError::Close)?;
    } else if !opts.readonly {
        // `unsafe`: the metadata is written, nothing is synced.
        disk.format().close().map_err(CliError::Close)?;
    }
    match output {
        OutputFormat::Human => println!(
            "Run completed in {:.3} seconds.",
            result.elapsed.as_secs_f64()
        ),
        OutputFormat::Json => print_json(&result.json(&params, disk.engine()))?,
    }
    Ok(0)
}

fn number(p: &crate::args::Parsed, name: &str, default: u64) -> Result<u64, CliError> {
    match p.value(name) {
        None => Ok(default),
        Some(v) => c_number(v)
            .ok_or_else(|| CliError::Usage(format!("Invalid value '{v}' for option -{name}"))),
    }
}

/// A number as qemu-img reads these options (strtoul with base 0):
/// `0x` hexadecimal, a leading `0` octal, else decimal.
fn c_number(v: &str) -> Option<u64> {
    if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if v.len() > 1 && v.starts_with('0') {
        u64::from_str_radix(&v[1..], 8).ok()
    } else {
        v.parse().ok()
    }
}

fn sized(p: &crate::args::Parsed, name: &str, default: u64) -> Result<u64, CliError> {
    match p.value(name) {
        None => Ok(default),
        Some(v) => parse_size(v)
            .ok()
            .ok_or_else(|| CliError::Usage(format!("Invalid size '{v}' for option -{name}"))),
    }
}

fn params(p: &crate::args::Parsed) -> Result<BenchParams, CliError> {
    let count = number(p, "c", 75000)?;
    let depth = number(p, "d", 64)?;
    if depth == 0 || depth > 65536 {
        return Err(CliError::Usage(
            "Invalid queue depth specified (1..=65536)".into(),
        ));
    }
    let size = sized(p, "s", 4096)?;
    if size == 0 || size > 64 << 20 {
        return Err(CliError::Usage(
            "Invalid buffer size specified (1 byte to 64 MiB)".into(),
        ));
    }
    let step = match sized(p, "S", 0)? {
        0 => size,
        s => s,
    };
    let write = p.flag("w");
    let read_percent = match p.value("rw-mix") {
        Some(v) => v.parse::<u64>().ok().filter(|&r| r <= 100).ok_or_else(|| {
            CliError::Usage(format!(
                "--rw-mix takes a read percentage 0..=100, not '{v}'"
            ))
        })?,
        None if write => 0,
        None => 100,
    };
    let pattern = match p.value("pattern") {
        None => 0xa5,
        Some(v) => c_number(v)
            .and_then(|n| u8::try_from(n).ok())
            .ok_or_else(|| CliError::Usage(format!("Invalid pattern byte specified: '{v}'")))?,
    };
    let flush_interval = number(p, "flush-interval", 0)?;
    let drain = !p.flag("no-drain");
    if flush_interval > 0 && read_percent == 100 {
        return Err(CliError::Usage(
            "--flush-interval is only available in write tests".into(),
        ));
    }
    if flush_interval > 0 && flush_interval < depth {
        return Err(CliError::Usage(
            "Flush interval can't be smaller than depth".into(),
        ));
    }
    if !drain && flush_interval == 0 {
        return Err(CliError::Usage(
            "--no-drain requires --flush-interval".into(),
        ));
    }
    // qemu-img bench words this error unlike the other verbs.
    let cache = parse_cache(p.value("t"), CacheMode::Writeback, CacheFlag::Target)
        .map_err(|_| CliError::Usage("Invalid cache mode".into()))?;
    let direct = cache.direct();
    let aio = if p.flag("n") {
        Some("native")
    } else {
        p.value("i")
    };
    let engine = match aio {
        None => EngineKind::Auto,
        Some("threads") | Some("sync") => EngineKind::Sync,
        Some("io_uring") => EngineKind::IoUring,
        Some("native") if direct => EngineKind::IoUring,
        Some("native") => {
            return Err(CliError::Usage(
                "aio=native was specified, but it requires cache.direct=on (-t none)".into(),
            ))
        }
        Some(other) => return Err(CliError::Usage(format!("Invalid aio option: {other}"))),
    };
    Ok(BenchParams {
        count,
        depth: depth as usize,
        size,
        step,
        offset: sized(p, "o", 0)?,
        read_percent,
        pattern,
        flush_interval,
        drain,
        random: p.flag("random"),
        seed: number(p, "seed", 1)?,
        direct,
        cache,
        engine,
    })
}

fn print_header(b: &BenchParams) {
    let kind = match b.read_percent {
        100 => "read".to_string(),
        0 => "write".to_string(),
        r => format!("mixed ({r}% read)"),
    };
    let placement = if b.random {
        format!("random offsets, seed {}", b.seed)
    } else {
        format!("starting at offset {}, step size {}", b.offset, b.step)
    };
    println!(
        "Sending {} {kind} requests, {} bytes each, {} in parallel ({placement})",
        b.count, b.size, b.depth
    );
    if b.flush_interval > 0 {
        println!("Sending flush every {} requests", b.flush_interval);
    }
}

/// splitmix64: offsets and read/write choices for `--random`/`--rw-mix`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// What a run measured.
struct BenchResult {
    elapsed: Duration,
    histogram: Vec<u64>,
    latency_sum_ns: u128,
    max_ns: u64,
}

impl BenchResult {
    fn percentile_us(&self, pct: f64) -> u64 {
        let total: u64 = self.histogram.iter().sum();
        let want = ((total as f64) * pct / 100.0).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.histogram.iter().enumerate() {
            seen += n;
            if seen >= want {
                return i as u64;
            }
        }
        HIST_BUCKETS as u64
    }

    fn json(&self, b: &BenchParams, engine: EngineKind) -> serde_json::Value {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let ops = b.count as f64 / secs;
        json!({
            "requests": b.count,
            "request_size": b.size,
            "depth": b.depth,
            "read_percent": b.read_percent,
            "random": b.random,
            "engine": if engine == EngineKind::IoUring { "io_uring" } else { "sync" },
            "direct": b.direct,
            "seconds": secs,
            "ops_per_sec": ops,
            "mib_per_sec": ops * b.size as f64 / (1024.0 * 1024.0),
            "lat_mean_us": self.latency_sum_ns as f64 / 1000.0 / (b.count.max(1) as f64),
            "lat_p50_us": self.percentile_us(50.0),
            "lat_p99_us": self.percentile_us(99.0),
            "lat_max_us": self.max_ns / 1000,
        })
    }
}

/// Keeps `depth` requests in flight until `count` have completed.
fn drive(disk: &Disk, b: &BenchParams) -> Result<BenchResult, CliError> {
    let mut queue = disk.queue().map_err(|source| CliError::Open {
        path: disk.options().path.clone(),
        source,
    })?;
    let disk_size = disk.size();
    let span = disk_size - b.size;
    let mut rng = Rng(b.seed);
    let mut next_offset = b.offset.min(span);
    // Page-aligned, so O_DIRECT requests need no bounce copy. Buffers
    // that hold the pattern are kept apart from those a read overwrote,
    // so writes refill a buffer only after a read used it.
    let mut pattern_buffers: Vec<AlignedBuf> = Vec::new();
    let mut read_buffers: Vec<AlignedBuf> = Vec::new();
    // Per slot: whether its request reads, and its offset (for errors).
    let mut slot_op: Vec<(bool, u64)> = vec![(true, 0); b.depth];
    let mut started: Vec<Option<Instant>> = vec![None; b.depth];
    let mut free_slots: Vec<usize> = (0..b.depth).rev().collect();
    let mut result = BenchResult {
        elapsed: Duration::ZERO,
        histogram: vec![0; HIST_BUCKETS + 1],
        latency_sum_ns: 0,
        max_ns: 0,
    };
    let (mut submitted, mut completed, mut since_flush) = (0u64, 0u64, 0u64);
    let mut flush_in_flight = false;
    let mut out = Vec::new();
    let t0 = Instant::now();
    while completed < b.count {
        let mut batch = Vec::new();
        while submitted < b.count && !flush_in_flight {
            if b.flush_interval > 0 && since_flush >= b.flush_interval {
                // `unsafe` ignores flushes, as qemu's cache=unsafe does.
                if !b.cache.flushes() {
                    since_flush = 0;
                    continue;
                }
                // Drain first (qemu-img's default): the flush covers every
                // write before it.
                if b.drain && free_slots.len() < b.depth {
                    break;
                }
                batch.push(BlockRequest {
                    user_data: FLUSH_TAG,
                    op: RequestOp::Flush,
                    offset: 0,
                    memory: IoMemory::None,
                });
                since_flush = 0;
                flush_in_flight = b.drain;
                continue;
            }
            let Some(slot) = free_slots.pop() else { break };
            let offset = if b.random {
                (rng.next() % (span / b.size + 1)) * b.size
            } else {
                let o = next_offset;
                next_offset = next_offset
                    .checked_add(b.step)
                    .filter(|&n| n <= span)
                    .unwrap_or(0);
                o
            };
            let is_read =
                b.read_percent == 100 || (b.read_percent > 0 && rng.next() % 100 < b.read_percent);
            let buf = if is_read {
                match read_buffers.pop().or_else(|| pattern_buffers.pop()) {
                    Some(buf) => buf,
                    None => new_buffer(b.size, b.pattern)?,
                }
            } else {
                match pattern_buffers.pop() {
                    Some(buf) => buf,
                    None => match read_buffers.pop() {
                        Some(mut buf) => {
                            buf.as_mut_slice().fill(b.pattern);
                            buf
                        }
                        None => new_buffer(b.size, b.pattern)?,
                    },
                }
            };
            slot_op[slot] = (is_read, offset);
            started[slot] = Some(Instant::now());
            batch.push(BlockRequest {
                user_data: slot as u64,
                op: if is_read {
                    RequestOp::Read
                } else {
                    RequestOp::Write
                },
                offset,
                memory: IoMemory::Aligned(buf),
            });
            submitted += 1;
            if !is_read {
                since_flush += 1;
            }
        }
        if !batch.is_empty() {
            queue.submit_batch_requests(batch);
        }
        wait_readable(queue.completion_eventfd().as_raw_fd())?;
        queue.drain_completions(&mut out);
        let mut syncs = Vec::new();
        for c in out.drain(..) {
            if c.user_data == FLUSH_TAG {
                if let Err(source) = c.result {
                    return Err(CliError::Flush(source));
                }
                flush_in_flight = false;
                continue;
            }
            let synced = c.user_data >= SYNC_TAG_BASE;
            let slot = (c.user_data & !SYNC_TAG_BASE) as usize;
            let (was_read, offset) = slot_op.get(slot).copied().unwrap_or((false, 0));
            if let Err(source) = c.result {
                return Err(if synced {
                    CliError::Flush(source)
                } else if was_read {
                    CliError::Read { offset, source }
                } else {
                    CliError::Write { offset, source }
                });
            }
            if let IoMemory::Aligned(buf) = c.memory {
                if was_read {
                    read_buffers.push(buf);
                } else {
                    pattern_buffers.push(buf);
                }
            }
            // Without a volatile write cache a write completes once a
            // flush has made it durable (qemu's writethrough).
            if !was_read && !synced && !b.cache.writeback() {
                syncs.push(BlockRequest {
                    user_data: SYNC_TAG_BASE | slot as u64,
                    op: RequestOp::Flush,
                    offset: 0,
                    memory: IoMemory::None,
                });
                continue;
            }
            if let Some(t) = started.get_mut(slot).and_then(Option::take) {
                let ns = t.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                result.latency_sum_ns += u128::from(ns);
                result.max_ns = result.max_ns.max(ns);
                result.histogram[((ns / 1000) as usize).min(HIST_BUCKETS)] += 1;
            }
            free_slots.push(slot);
            completed += 1;
        }
        if !syncs.is_empty() {
            queue.submit_batch_requests(syncs);
        }
    }
    result.elapsed = t0.elapsed();
    Ok(result)
}

/// Blocks until the completion eventfd is readable (a short timeout
/// re-checks, so a missed wake-up cannot hang the run).
fn wait_readable(fd: i32) -> Result<(), CliError> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and
    // the count is 1.
    let r = unsafe { libc::poll(&mut pfd, 1, 100) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(CliError::Os {
                what: "poll the completion eventfd",
                source: e,
            });
        }
    }
    Ok(())
}

/// A page-aligned request buffer filled with `pattern`.
fn new_buffer(size: u64, pattern: u8) -> Result<AlignedBuf, CliError> {
    let mut buf = AlignedBuf::new(size as usize, 4096)
        .ok_or_else(|| CliError::Usage(format!("cannot allocate a {size}-byte buffer")))?;
    buf.as_mut_slice().fill(pattern);
    Ok(buf)
}
