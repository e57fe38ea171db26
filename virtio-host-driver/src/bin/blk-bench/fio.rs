//! The limit beside us: fio with io_uring and O_DIRECT (or buffered, as
//! `--direct` says) on the same file
//! (raw images) or on a raw copy (qcow2), same pattern, size and depth.
//!
//! Data enters as [`Options`]; fio runs as a child process with JSON
//! output, which leaves as [`RunStats`] with fio's whole-process CPU time
//! (user + system of fio and its job processes, io-wq workers included,
//! from the rusage of the children we waited for).

use std::path::{Path, PathBuf};
use std::process::Command;

use block::{Disk, DiskOptions};
use serde_json::Value;

use crate::args::Options;
use crate::stats::{RunCpu, RunStats};

/// The file fio runs on, removed on drop when it is a converted copy.
pub struct FioTarget {
    pub path: PathBuf,
    pub size: u64,
    temporary: bool,
}

impl Drop for FioTarget {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The image itself when it is raw, else a raw copy made by qemu-img.
pub fn fio_target(o: &Options) -> Result<FioTarget, String> {
    let mut d = DiskOptions::new(&o.image);
    d.image_type = o.format;
    d.readonly = true;
    d.lock = false;
    let disk = Disk::open(&d).map_err(|e| format!("cannot open {}: {e}", o.image.display()))?;
    let size = disk.size();
    if disk.format().name() == "raw" {
        return Ok(FioTarget {
            path: o.image.clone(),
            size,
            temporary: false,
        });
    }
    drop(disk);
    let mut copy = o.image.clone().into_os_string();
    copy.push(".fio-raw");
    let copy = PathBuf::from(copy);
    let status = Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(&o.image)
        .arg(&copy)
        .status()
        .map_err(|e| format!("cannot run qemu-img: {e}"))?;
    if !status.success() {
        return Err(format!("qemu-img convert to {} failed", copy.display()));
    }
    Ok(FioTarget {
        path: copy,
        size,
        temporary: true,
    })
}

fn fio_args(o: &Options, file: &Path, size: u64) -> Vec<String> {
    let depth = if o.think_us > 0 { o.batch } else { o.qd };
    let mut a = vec![
        "--name=blk-bench".to_string(),
        format!("--filename={}", file.display()),
        "--ioengine=io_uring".into(),
        format!("--direct={}", u8::from(o.direct)),
        format!("--rw={}", o.rw.fio_name()),
        format!("--bs={}", o.bs),
        format!("--iodepth={depth}"),
        format!("--numjobs={}", o.queues),
        format!("--size={size}"),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ];
    match o.io_size {
        Some(b) => a.push(format!("--io_size={b}")),
        None => {
            a.push("--time_based".into());
            a.push(format!("--runtime={}", o.runtime_s.ceil() as u64));
        }
    }
    a
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// User + system CPU time (ns) of the children this process has waited
/// for, fio's job processes included (fio waits for them).
fn children_cpu_ns() -> u64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_usec).unwrap_or(0) * 1_000
    };
    ns(u.ru_utime) + ns(u.ru_stime)
}

/// Runs fio once.
pub fn run_fio(o: &Options, target: &FioTarget) -> Result<RunStats, String> {
    let cpu_before = children_cpu_ns();
    let out = Command::new("fio")
        .args(fio_args(o, &target.path, target.size))
        .output()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    let whole_ns = children_cpu_ns().saturating_sub(cpu_before);
    if !out.status.success() {
        return Err(format!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // fio may print warnings before the JSON document.
    let text = String::from_utf8_lossy(&out.stdout);
    let json_start = text.find('{').ok_or("fio printed no JSON")?;
    let v: Value =
        serde_json::from_str(&text[json_start..]).map_err(|e| format!("fio JSON: {e}"))?;
    let job = &v["jobs"][0];
    let side = if o.rw.is_write() {
        &job["write"]
    } else {
        &job["read"]
    };
    let pct = |p: &str| f(&side["clat_ns"]["percentile"][p]) / 1000.0;
    Ok(RunStats {
        label: "fio".into(),
        ops: side["total_ios"].as_u64().unwrap_or(0),
        bytes: side["io_bytes"].as_u64().unwrap_or(0),
        elapsed_s: f(&side["runtime"]) / 1000.0,
        lat_mean_us: f(&side["lat_ns"]["mean"]) / 1000.0,
        lat_p50_us: pct("50.000000"),
        lat_p99_us: pct("99.000000"),
        lat_max_us: f(&side["clat_ns"]["max"]) / 1000.0,
        think_s: 0.0,
        threads: Vec::new(),
        cpu: RunCpu::Process { whole_ns },
    })
}
