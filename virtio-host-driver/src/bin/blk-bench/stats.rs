//! Results of one run (ours or fio's), and how they are printed.
//!
//! Data enters as per-request latencies and totals; it leaves as a JSON
//! object ([`RunStats::to_json`]) or table rows.

use serde_json::{json, Value};

use crate::thread_cpu::ThreadCpu;

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
        v
    }

    pub fn table_header() -> &'static str {
        "| run | ops/s | MiB/s | lat mean us | lat p50 us | lat p99 us | elapsed s | think s |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    }

    pub fn table_row(&self) -> String {
        format!(
            "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} |",
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
