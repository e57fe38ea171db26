//! Per-thread CPU time and context switches of a run, from procfs.
//!
//! Data enters as `/proc/thread-self` (a driver thread reads its own at
//! the end of its run) or `/proc/self/task/*` (the device's queue
//! workers, read before the device is closed); it leaves as
//! [`ThreadCpu`] records that the JSON output prints per thread, divided
//! by the requests of the run. CPU time is `schedstat`'s time on CPU
//! (nanoseconds, user and system together); context switches are the
//! voluntary (the thread slept: a wake-up) and involuntary ones of
//! `status`. These counts do not change with the machine's noise the way
//! IOPS do, which is what the per-request comparisons need.

use std::fs;
use std::path::Path;

/// What one thread used up to the moment it was read.
#[derive(Clone, Debug, Default)]
pub struct ThreadCpu {
    pub name: String,
    pub cpu_ns: u64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
}

impl ThreadCpu {
    /// Reads the thread whose procfs directory is `dir`; None if it is
    /// gone or unreadable.
    pub fn read(dir: &Path) -> Option<ThreadCpu> {
        let name = fs::read_to_string(dir.join("comm"))
            .ok()?
            .trim()
            .to_string();
        let schedstat = fs::read_to_string(dir.join("schedstat")).ok()?;
        let cpu_ns = schedstat.split_whitespace().next()?.parse().ok()?;
        let status = fs::read_to_string(dir.join("status")).ok()?;
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Some(ThreadCpu {
            name,
            cpu_ns,
            voluntary_switches: field("voluntary_ctxt_switches:"),
            involuntary_switches: field("nonvoluntary_ctxt_switches:"),
        })
    }

    /// The calling thread.
    pub fn current() -> Option<ThreadCpu> {
        ThreadCpu::read(Path::new("/proc/thread-self"))
    }

    /// Every thread of this process whose name starts with `prefix`.
    pub fn named(prefix: &str) -> Vec<ThreadCpu> {
        let Ok(tasks) = fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        let mut out: Vec<ThreadCpu> = tasks
            .filter_map(|e| ThreadCpu::read(&e.ok()?.path()))
            .filter(|t| t.name.starts_with(prefix))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// JSON with the per-request figures over `ops` requests.
    pub fn to_json(&self, ops: u64) -> serde_json::Value {
        let per = |v: f64| v / ops.max(1) as f64;
        serde_json::json!({
            "name": self.name,
            "cpu_s": self.cpu_ns as f64 / 1e9,
            "cpu_us_per_op": per(self.cpu_ns as f64 / 1e3),
            "voluntary_switches_per_op": per(self.voluntary_switches as f64),
            "involuntary_switches_per_op": per(self.involuntary_switches as f64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_thread_has_a_name_and_cpu_time() {
        let t = std::thread::Builder::new()
            .name("cpu-probe".into())
            .spawn(|| {
                // Burn a little CPU so the time cannot be zero.
                let mut x = 0u64;
                for i in 0..2_000_000u64 {
                    x = x.wrapping_mul(31).wrapping_add(i);
                }
                std::hint::black_box(x);
                let me = ThreadCpu::current().unwrap();
                let listed = ThreadCpu::named("cpu-probe");
                (me, listed)
            })
            .unwrap();
        let (me, listed) = t.join().unwrap();
        assert_eq!(me.name, "cpu-probe");
        assert!(me.cpu_ns > 0);
        assert_eq!(listed.len(), 1);
        assert!(listed[0].cpu_ns >= me.cpu_ns);
        let j = me.to_json(1000);
        assert!(j["cpu_us_per_op"].as_f64().unwrap() > 0.0);
    }
}
