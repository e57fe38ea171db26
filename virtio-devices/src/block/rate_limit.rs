//! I/O throttling of a virtio-blk queue: two token buckets, one counting
//! bytes and one counting requests, with Cloud Hypervisor's options
//! (`bw_size`, `bw_one_time_burst`, `bw_refill_time`, `ops_size`,
//! `ops_one_time_burst`, `ops_refill_time`).
//!
//! A bucket holds at most `size` tokens and refills `size` tokens every
//! `refill_time` milliseconds, continuously; it starts full, plus a
//! one-time burst that is spent first and never refills. A request takes
//! one op token and as many byte tokens as it moves (reads and writes;
//! other requests move no bytes). The queue worker asks
//! [`RateLimiter::admit`] before it takes a chain off the ring: when a
//! bucket cannot pay, the chain stays on the ring and the worker sleeps
//! on a timer for the time the bucket needs. A request larger than a
//! whole bucket is let through when the bucket is full and leaves it in
//! debt, so it cannot stall the queue and the long-run rate still holds.
//!
//! Written here rather than taken from a crate: the rate limiter Cloud
//! Hypervisor and Firecracker use is not published as a crate of its own,
//! and the arithmetic is a few integer operations.

use std::time::{Duration, Instant};

/// One bucket's options: `size` tokens per `refill_time`, plus a one-time
/// burst.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketConfig {
    /// Tokens the bucket holds when full (and refills per `refill_time`).
    pub size: u64,
    /// Extra tokens available once, spent before the bucket's own.
    pub one_time_burst: u64,
    /// Milliseconds to refill `size` tokens; at least 1.
    pub refill_time_ms: u64,
}

/// The limits of one disk (each queue of the disk enforces them on its
/// own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// Bytes moved by reads and writes.
    pub bandwidth: Option<TokenBucketConfig>,
    /// Requests of any kind.
    pub ops: Option<TokenBucketConfig>,
}

impl RateLimitConfig {
    pub fn is_enabled(&self) -> bool {
        self.bandwidth.is_some() || self.ops.is_some()
    }
}

/// A token bucket in integer arithmetic: the balance is kept in
/// "token-nanoseconds" (tokens times `refill_ns`), so refilling adds
/// `elapsed_ns * size` exactly.
#[derive(Debug)]
struct TokenBucket {
    size: u128,
    refill_ns: u128,
    /// Tokens x `refill_ns`; negative after an oversized request.
    balance: i128,
    burst: u64,
    last: Instant,
}

impl TokenBucket {
    fn new(c: TokenBucketConfig, now: Instant) -> Self {
        let size = u128::from(c.size.max(1));
        let refill_ns = u128::from(c.refill_time_ms.max(1)) * 1_000_000;
        TokenBucket {
            size,
            refill_ns,
            balance: Self::scaled(size, refill_ns),
            burst: c.one_time_burst,
            last: now,
        }
    }

    fn scaled(tokens: u128, refill_ns: u128) -> i128 {
        i128::try_from(tokens.saturating_mul(refill_ns)).unwrap_or(i128::MAX)
    }

    fn full(&self) -> i128 {
        Self::scaled(self.size, self.refill_ns)
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_nanos();
        self.last = now;
        let added = Self::scaled(elapsed, self.size);
        self.balance = self.balance.saturating_add(added).min(self.full());
    }

    /// The wait before `tokens` can be paid (zero: now).
    fn wait_for(&self, tokens: u64) -> Duration {
        let need = Self::scaled(
            u128::from(tokens.saturating_sub(self.burst)),
            self.refill_ns,
        )
        // A request larger than the bucket only needs a full bucket.
        .min(self.full());
        let missing = need.saturating_sub(self.balance);
        if missing <= 0 {
            return Duration::ZERO;
        }
        // balance grows by `size` per nanosecond; round up.
        let ns = (missing as u128).div_ceil(self.size);
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// Pays `tokens` (the caller checked [`TokenBucket::wait_for`]).
    fn pay(&mut self, tokens: u64) {
        let from_burst = tokens.min(self.burst);
        self.burst -= from_burst;
        let rest = u128::from(tokens - from_burst);
        self.balance = self
            .balance
            .saturating_sub(Self::scaled(rest, self.refill_ns));
    }
}

/// The buckets of one queue.
#[derive(Debug)]
pub struct RateLimiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
}

impl RateLimiter {
    /// `None` when `config` limits nothing.
    pub fn new(config: RateLimitConfig, now: Instant) -> Option<Self> {
        config.is_enabled().then(|| RateLimiter {
            bandwidth: config.bandwidth.map(|c| TokenBucket::new(c, now)),
            ops: config.ops.map(|c| TokenBucket::new(c, now)),
        })
    }

    /// Takes one request of `bytes` bytes if both buckets can pay now;
    /// otherwise takes nothing and says how long to wait.
    pub fn admit(&mut self, bytes: u64, now: Instant) -> Result<(), Duration> {
        let mut wait = Duration::ZERO;
        for (bucket, tokens) in [(&mut self.bandwidth, bytes), (&mut self.ops, 1)] {
            if let Some(b) = bucket {
                b.refill(now);
                wait = wait.max(b.wait_for(tokens));
            }
        }
        if !wait.is_zero() {
            return Err(wait);
        }
        if let Some(b) = &mut self.bandwidth {
            b.pay(bytes);
        }
        if let Some(b) = &mut self.ops {
            b.pay(1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(size: u64, burst: u64, ms: u64) -> RateLimitConfig {
        RateLimitConfig {
            bandwidth: None,
            ops: Some(TokenBucketConfig {
                size,
                one_time_burst: burst,
                refill_time_ms: ms,
            }),
        }
    }

    #[test]
    fn nothing_configured_means_no_limiter() {
        assert!(RateLimiter::new(RateLimitConfig::default(), Instant::now()).is_none());
    }

    #[test]
    fn a_full_bucket_then_its_refill_rate() {
        let t0 = Instant::now();
        // 10 ops per 100 ms.
        let mut r = RateLimiter::new(ops(10, 0, 100), t0).unwrap();
        for _ in 0..10 {
            assert_eq!(r.admit(0, t0), Ok(()));
        }
        // Empty: the next op needs a tenth of the refill time.
        assert_eq!(r.admit(0, t0), Err(Duration::from_millis(10)));
        assert_eq!(
            r.admit(0, t0 + Duration::from_millis(9)),
            Err(Duration::from_millis(1))
        );
        assert_eq!(r.admit(0, t0 + Duration::from_millis(10)), Ok(()));
        // Refilling never goes past a full bucket.
        let later = t0 + Duration::from_secs(10);
        for _ in 0..10 {
            assert_eq!(r.admit(0, later), Ok(()));
        }
        assert!(r.admit(0, later).is_err());
    }

    #[test]
    fn the_one_time_burst_is_spent_first_and_never_refills() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(ops(2, 3, 1000), t0).unwrap();
        for _ in 0..5 {
            assert_eq!(r.admit(0, t0), Ok(()));
        }
        assert!(r.admit(0, t0).is_err());
        let later = t0 + Duration::from_secs(60);
        for _ in 0..2 {
            assert_eq!(r.admit(0, later), Ok(()));
        }
        assert!(r.admit(0, later).is_err());
    }

    #[test]
    fn bytes_and_ops_both_have_to_pay() {
        let t0 = Instant::now();
        let cfg = RateLimitConfig {
            bandwidth: Some(TokenBucketConfig {
                size: 8192,
                one_time_burst: 0,
                refill_time_ms: 1000,
            }),
            ops: Some(TokenBucketConfig {
                size: 100,
                one_time_burst: 0,
                refill_time_ms: 1000,
            }),
        };
        let mut r = RateLimiter::new(cfg, t0).unwrap();
        assert_eq!(r.admit(4096, t0), Ok(()));
        assert_eq!(r.admit(4096, t0), Ok(()));
        // Out of bytes, not of ops: 4096 bytes at 8192/s is half a second.
        assert_eq!(r.admit(4096, t0), Err(Duration::from_millis(500)));
        // A request that moves no bytes only pays an op.
        assert_eq!(r.admit(0, t0), Ok(()));
    }

    #[test]
    fn an_oversized_request_passes_on_a_full_bucket_and_leaves_a_debt() {
        let t0 = Instant::now();
        let cfg = RateLimitConfig {
            bandwidth: Some(TokenBucketConfig {
                size: 1000,
                one_time_burst: 0,
                refill_time_ms: 1000,
            }),
            ops: None,
        };
        let mut r = RateLimiter::new(cfg, t0).unwrap();
        assert_eq!(r.admit(3000, t0), Ok(()));
        // 2000 bytes in debt plus a full bucket for the next big one:
        // three seconds at 1000 bytes per second.
        assert_eq!(r.admit(3000, t0), Err(Duration::from_secs(3)));
        assert_eq!(r.admit(500, t0), Err(Duration::from_millis(2500)));
        assert_eq!(r.admit(3000, t0 + Duration::from_secs(3)), Ok(()));
    }
}
