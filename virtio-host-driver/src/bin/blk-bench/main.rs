//! `blk-bench`: measures the virtio-blk device path without a guest.
//!
//! A host-side driver (virtio_host_driver) plays the guest: real
//! guest memory, real split virtqueues, real eventfds and the device's own
//! worker threads over a real image. Options come from the command line
//! (see `--help`); results leave on stdout as a table or JSON. With
//! `--compare-fio`, fio runs interleaved with us and the medians and
//! ratios are printed.

mod args;
mod fio;
mod stats;
mod thread_cpu;
mod workload;

use serde_json::json;

use args::Options;
use stats::{median, RunStats};

fn config_json(o: &Options) -> serde_json::Value {
    json!({
        "image": o.image.display().to_string(),
        "format": format!("{:?}", o.format).to_lowercase(),
        "engine": o.engine.to_string(),
        "direct": o.direct,
        "queues": o.queues,
        "qd": o.qd,
        "bs": o.bs,
        "rw": o.rw.fio_name(),
        "runtime_s": o.runtime_s,
        "io_size": o.io_size,
        "think_us": o.think_us,
        "batch": o.batch,
        "poll_us": o.poll_us,
        "halt_poll_us": o.halt_poll_us,
    })
}

fn single(o: &Options) -> Result<(), String> {
    // The time the device's queue threads spend inside io_submit /
    // io_uring_enter (what blocks native AIO on sparse images).
    block::engines::submit_stats::enable();
    let s = workload::run_ours(o)?;
    let submit = block::engines::submit_stats::take();
    if o.json {
        let mut v = s.to_json();
        v["config"] = config_json(o);
        v["submit_calls"] = json!(submit.calls);
        v["submit_p50_us"] = json!(submit.p50.as_secs_f64() * 1e6);
        v["submit_p99_us"] = json!(submit.p99.as_secs_f64() * 1e6);
        v["submit_max_us"] = json!(submit.max.as_secs_f64() * 1e6);
        v["submit_entries_p50"] = json!(submit.entries_p50);
        v["submit_entries_max"] = json!(submit.entries_max);
        v["submit_by_entries"] = json!(submit
            .by_size
            .iter()
            .map(|c| json!({
                "entries": [c.min_entries, c.max_entries],
                "calls": c.times.calls,
                "p50_us": c.times.p50.as_secs_f64() * 1e6,
                "p99_us": c.times.p99.as_secs_f64() * 1e6,
                "max_us": c.times.max.as_secs_f64() * 1e6,
            }))
            .collect::<Vec<_>>());
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("{}", RunStats::table_header());
        println!("{}", s.table_row());
    }
    Ok(())
}

struct Medians {
    ops: f64,
    mib: f64,
    mean: f64,
    p99: f64,
    elapsed: f64,
    think: f64,
    /// CPU us per request: whole less driver (ours) or whole (fio).
    cpu: f64,
    /// Ours by kind: worker, io-wq, driver (zeros for fio).
    kinds: [f64; 3],
}

fn medians(runs: &[RunStats]) -> Medians {
    let m = |g: &dyn Fn(&RunStats) -> f64| median(runs.iter().map(g).collect());
    let kind = |i: usize| m(&|r| r.cpu.kinds_us(r.ops).map_or(0.0, |k| k[i]));
    Medians {
        ops: m(&RunStats::ops_per_sec),
        mib: m(&RunStats::mib_per_sec),
        mean: m(&|r| r.lat_mean_us),
        p99: m(&|r| r.lat_p99_us),
        elapsed: m(&|r| r.elapsed_s),
        think: m(&|r| r.think_s),
        cpu: m(&|r| r.cpu.comparable_us(r.ops).unwrap_or(0.0)),
        kinds: [kind(0), kind(1), kind(2)],
    }
}

/// The median over rounds of ours / fio within each round (the two ran
/// next to each other, so drift of the machine cancels).
fn paired_ratio(ours: &[RunStats], fio: &[RunStats], g: impl Fn(&RunStats) -> f64) -> f64 {
    median(
        ours.iter()
            .zip(fio)
            .map(|(a, b)| ratio(g(a), g(b)))
            .collect(),
    )
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn compare(o: &Options) -> Result<(), String> {
    let target = fio::fio_target(o)?;
    let mut ours = Vec::new();
    let mut fio_runs = Vec::new();
    for i in 0..o.repeats {
        // Alternate who goes first so drift hits both sides alike.
        if i % 2 == 0 {
            ours.push(workload::run_ours(o)?);
            fio_runs.push(fio::run_fio(o, &target)?);
        } else {
            fio_runs.push(fio::run_fio(o, &target)?);
            ours.push(workload::run_ours(o)?);
        }
    }
    let a = medians(&ours);
    let b = medians(&fio_runs);
    let cpu_of = |r: &RunStats| r.cpu.comparable_us(r.ops).unwrap_or(0.0);
    let cpu_ratio = paired_ratio(&ours, &fio_runs, cpu_of);
    let ops_ratio_paired = paired_ratio(&ours, &fio_runs, RunStats::ops_per_sec);
    // The stall criterion of issue #4: our elapsed time within 1.1 x
    // (our think time + fio's time for the same I/O without think time).
    let stall = (o.think_us > 0).then(|| {
        let limit = 1.1 * (a.think + b.elapsed);
        (limit, a.elapsed <= limit)
    });
    if o.json {
        let v = json!({
            "config": config_json(o),
            "ours": ours.iter().map(RunStats::to_json).collect::<Vec<_>>(),
            "fio": fio_runs.iter().map(RunStats::to_json).collect::<Vec<_>>(),
            "median": {
                "ours": {"ops_per_sec": a.ops, "mib_per_sec": a.mib, "lat_mean_us": a.mean, "lat_p99_us": a.p99, "elapsed_s": a.elapsed, "think_s": a.think,
                         "cpu_us_per_op_whole_less_driver": a.cpu, "cpu_us_per_op_worker": a.kinds[0], "cpu_us_per_op_io_wq": a.kinds[1], "cpu_us_per_op_driver": a.kinds[2]},
                "fio": {"ops_per_sec": b.ops, "mib_per_sec": b.mib, "lat_mean_us": b.mean, "lat_p99_us": b.p99, "elapsed_s": b.elapsed, "cpu_us_per_op_whole": b.cpu},
                "ratio_ops_per_sec": ratio(a.ops, b.ops),
                "ratio_lat_mean": ratio(a.mean, b.mean),
                "ratio_cpu_per_op": ratio(a.cpu, b.cpu),
                "ratio_ops_per_sec_paired": ops_ratio_paired,
                "ratio_cpu_per_op_paired": cpu_ratio,
            },
            "stall_check": stall.map(|(limit, ok)| json!({"limit_s": limit, "elapsed_s": a.elapsed, "pass": ok})),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    println!("{}", RunStats::table_header());
    for r in ours.iter().chain(fio_runs.iter()) {
        println!("{}", r.table_row());
    }
    println!();
    println!(
        "| median of {} | blk-bench | fio | blk-bench / fio |",
        o.repeats
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| ops/s | {:.0} | {:.0} | {:.2} |",
        a.ops,
        b.ops,
        ratio(a.ops, b.ops)
    );
    println!(
        "| MiB/s | {:.1} | {:.1} | {:.2} |",
        a.mib,
        b.mib,
        ratio(a.mib, b.mib)
    );
    println!(
        "| lat mean us | {:.1} | {:.1} | {:.2} |",
        a.mean,
        b.mean,
        ratio(a.mean, b.mean)
    );
    println!(
        "| lat p99 us | {:.1} | {:.1} | {:.2} |",
        a.p99,
        b.p99,
        ratio(a.p99, b.p99)
    );
    println!(
        "| elapsed s | {:.3} | {:.3} | {:.2} |",
        a.elapsed,
        b.elapsed,
        ratio(a.elapsed, b.elapsed)
    );
    println!(
        "| CPU us/req (ours: whole less driver; fio: whole) | {:.2} | {:.2} | {:.2} |",
        a.cpu,
        b.cpu,
        ratio(a.cpu, b.cpu)
    );
    println!(
        "| ours: worker / io-wq / driver us/req | {:.2} / {:.2} / {:.2} | | |",
        a.kinds[0], a.kinds[1], a.kinds[2]
    );
    println!();
    println!(
        "Per round (ours / fio of the same round), median: ops/s {ops_ratio_paired:.2}, CPU per request {cpu_ratio:.2}"
    );
    if let Some((limit, ok)) = stall {
        println!();
        println!(
            "stall check: blk-bench {:.3} s vs limit 1.1 x (think {:.3} s + fio {:.3} s) = {:.3} s: {}",
            a.elapsed,
            a.think,
            b.elapsed,
            limit,
            if ok { "PASS" } else { "FAIL" }
        );
    }
    Ok(())
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let o = match args::parse(&argv) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{}", args::USAGE);
            return;
        }
        Err(e) => {
            eprintln!("blk-bench: {e}");
            std::process::exit(2);
        }
    };
    let r = if o.compare_fio {
        compare(&o)
    } else {
        single(&o)
    };
    if let Err(e) = r {
        eprintln!("blk-bench: {e}");
        std::process::exit(1);
    }
}
