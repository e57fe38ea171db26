//! Results of one run (ours or fio's), and how they are printed.
//!
//! Data enters as per-request latencies and totals; it leaves as a JSON
//! object ([`RunStats::to_json`]) or table rows.

use serde_json::{json, Value};

use crate::thread_cpu::{CpuSplit, ThreadCpu};

/// The CPU time a run used.
#[derive(Clone, Copy, Debug, Default)]
pub enum RunCpu {
    #[default]
    Unknown,
    /// Ours, by thread kind.
    Split(CpuSplit),
    /// A whole process measured from outside (fio: its rusage after
    /// `wait4`, its io-wq workers included).
    Process { whole_ns: u64 },
}

impl RunCpu {
    /// CPU per request (us) to set against fio's whole process: ours
    /// less the driver threads that stand in for the guest, fio's whole.
    pub fn comparable_us(&self, ops: u64) -> Option<f64> {
        let ns = match *self {
            RunCpu::Unknown => return None,
            RunCpu::Split(s) => s.whole_less_driver_ns(),
            RunCpu::Process { whole_ns } => whole_ns,
        };
        Some(ns as f64 / 1e3 / ops.max(1) as f64)
    }

    /// Ours by kind (us per request): worker, io-wq, driver.
    pub fn kinds_us(&self, ops: u64) -> Option<[f64; 3]> {
        let RunCpu::Split(s) = self else {
            return None;
        };
        let per = |ns: u64| ns as f64 / 1e3 / ops.max(1) as f64;
        Some([per(s.worker_ns), per(s.io_wq_ns), per(s.driver_ns)])
    }
}

#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub label: String,
    pub ops: u64,
    pub bytes: u64,
    pub elapsed_s: f64,
    pub lat_mean_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_max_us: f64,
    /// Driver think time actually spent (sleeps), summed over queues.
    pub think_s: f64,
    /// CPU time and context switches of our threads (drivers and the
    /// device's queue workers); empty for fio.
    pub threads: Vec<ThreadCpu>,
    /// The run's CPU time, whole process and (ours) by thread kind.
    pub cpu: RunCpu,
}

impl RunStats {
    /// Builds stats from latencies in nanoseconds (sorted in place).
    pub fn from_latencies(
        label: &str,
        lat_ns: &mut [u64],
        bytes: u64,
        elapsed_s: f64,
        think_s: f64,
    ) -> Self {
        lat_ns.sort_unstable();
        let n = lat_ns.len();
        let pct = |p: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            lat_ns[i] as f64 / 1000.0
        };
        let mean = if n == 0 {
            0.0
        } else {
            lat_ns.iter().map(|&x| x as f64).sum::<f64>() / n as f64 / 1000.0
        };
        RunStats {
            label: label.to_string(),
            ops: n as u64,
            bytes,
            elapsed_s,
            lat_mean_us: mean,
            lat_p50_us: pct(0.50),
            lat_p99_us: pct(0.99),
            lat_max_us: pct(1.0),
            think_s,
            threads: Vec::new(),
            cpu: RunCpu::Unknown,
        }
    }

    pub fn ops_per_sec(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.ops as f64 / self.elapsed_s
        } else {
            0.0
        }
    }

    pub fn mib_per_sec(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.bytes as f64 / self.elapsed_s / (1 << 20) as f64
        } else {
            0.0
        }
    }

    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "label": self.label,
            "ops": self.ops,
            "bytes": self.bytes,
            "elapsed_s": self.elapsed_s,
            "ops_per_sec": self.ops_per_sec(),
            "mib_per_sec": self.mib_per_sec(),
            "lat_mean_us": self.lat_mean_us,
            "lat_p50_us": self.lat_p50_us,
            "lat_p99_us": self.lat_p99_us,
            "lat_max_us": self.lat_max_us,
            "think_s": self.think_s,
        });
        if !self.threads.is_empty() {
            v["threads"] = self.threads.iter().map(|t| t.to_json(self.ops)).collect();
        }
        match self.cpu {
            RunCpu::Unknown => {}
            RunCpu::Split(s) => v["cpu_us_per_op"] = s.to_json(self.ops),
            RunCpu::Process { whole_ns } => {
                v["cpu_us_per_op"] =
                    json!({ "whole": whole_ns as f64 / 1e3 / self.ops.max(1) as f64 })
            }
        }
        v
    }

    pub fn table_header() -> &'static str {
        "| run | ops/s | MiB/s | lat mean us | lat p50 us | lat p99 us | elapsed s | think s | CPU us/req (whole less driver) | worker | io-wq | driver |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    }

    pub fn table_row(&self) -> String {
        let cpu = self
            .cpu
            .comparable_us(self.ops)
            .map_or("-".to_string(), |c| format!("{c:.2}"));
        let kinds = self
            .cpu
            .kinds_us(self.ops)
            .map_or("- | - | -".to_string(), |[w, q, d]| {
                format!("{w:.2} | {q:.2} | {d:.2}")
            });
        format!(
            "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {cpu} | {kinds} |",
            self.label,
            self.ops_per_sec(),
            self.mib_per_sec(),
            self.lat_mean_us,
            self.lat_p50_us,
            self.lat_p99_us,
            self.elapsed_s,
            self.think_s
        )
    }
}

/// Median of the values (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_rates() {
        let mut lat: Vec<u64> = (1..=100).map(|i| i * 1000).collect();
        let s = RunStats::from_latencies("x", &mut lat, 100 << 20, 2.0, 0.0);
        assert_eq!(s.lat_p50_us, 50.0);
        assert_eq!(s.lat_p99_us, 99.0);
        assert_eq!(s.lat_max_us, 100.0);
        assert_eq!(s.lat_mean_us, 50.5);
        assert_eq!(s.ops_per_sec(), 50.0);
        assert_eq!(s.mib_per_sec(), 50.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
