//! `--disk`: one virtio-blk device. Keys: `path`, `readonly`, `direct`,
//! `cache` (QEMU's five modes), `num_queues`, `queue_size`, `image_type`,
//! `engine` (auto, io_uring, aio, threads, sync), `id`, `serial`, and
//! Cloud Hypervisor's throttling keys `bw_size`, `bw_one_time_burst`,
//! `bw_refill_time`, `ops_size`, `ops_one_time_burst`, `ops_refill_time`,
//! and `queue_affinity=[QUEUE@[CPUS],...]` (CPUS: numbers and ranges).
//! Our own key `poll_us=N` (0 to 1000, default 32) is the ceiling of each
//! queue worker's adaptive spin before it sleeps; 0 turns it off
//! (docs/disk-options.md, "Polling"; QEMU's iothread `poll-max-ns` plays
//! this part).
//!
//! `vhost_user=on` makes the disk a vhost-user one, parsed by
//! [`super::vhost_user_disk`] instead; `vhost_user=off` is accepted here.
//!
//! Enters as the option's string; leaves as a [`DiskConfig`] holding the
//! block crate's [`DiskOptions`] plus the device's queue settings. Nothing is
//! opened here.

use block::options::kv::KvError;
use block::options::take_image_options;
use block::DiskOptions;
use virtio_devices::block::rate_limit::{RateLimitConfig, TokenBucketConfig};
use virtio_devices::block::DEFAULT_POLL_US;

use super::ConfigError;
use block::options::kv::{parse_on_off, split_top_level, KvList};

/// Most queues per disk: the vCPU count is small on our machines and each
/// queue is a thread.
pub const MAX_QUEUES: u16 = 64;
/// Largest split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// The virtio-blk serial (GET_ID) is at most 20 bytes.
pub const MAX_SERIAL: usize = 20;

#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub options: DiskOptions,
    pub num_queues: u16,
    pub queue_size: u16,
    pub id: Option<String>,
    pub serial: Option<String>,
    /// Throttling of each of the disk's queues (nothing by default).
    pub rate_limit: RateLimitConfig,
    /// Host CPUs per queue index (`None`: not pinned).
    pub queue_affinity: Vec<Option<Vec<usize>>>,
    /// Ceiling of the queue workers' adaptive spin in microseconds (0: none).
    pub poll_us: u32,
}

/// Largest `poll_us` (the device caps its spin at 1 ms).
pub const MAX_POLL_US: u32 = 1000;

/// `[0@[0,2-3],1@[1]]`: for each listed queue (below `num_queues`, once),
/// the host CPUs its worker may run on, each one this process may use.
fn parse_queue_affinity(
    num_queues: u16,
) -> impl Fn(&str) -> Result<Vec<Option<Vec<usize>>>, String> {
    move |s| {
        let inner = s
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .ok_or("expected [QUEUE@[CPUS],...]")?;
        let allowed = allowed_cpus()?;
        let mut out = vec![None; usize::from(num_queues)];
        for item in split_top_level(inner).ok_or("unbalanced brackets")? {
            let (queue, cpus) = item
                .split_once('@')
                .ok_or_else(|| format!("'{item}': expected QUEUE@[CPUS]"))?;
            let q: usize = queue
                .parse()
                .ok()
                .filter(|&q| q < usize::from(num_queues))
                .ok_or_else(|| format!("queue '{queue}': expected 0 to {}", num_queues - 1))?;
            if out[q].is_some() {
                return Err(format!("queue {q} is given twice"));
            }
            let list = cpus
                .strip_prefix('[')
                .and_then(|s| s.strip_suffix(']'))
                .ok_or_else(|| format!("'{cpus}': expected [CPUS]"))?;
            let mut set = Vec::new();
            for range in list.split(',') {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                let (a, b): (usize, usize) = match (a.parse(), b.parse()) {
                    (Ok(a), Ok(b)) if a <= b => (a, b),
                    _ => return Err(format!("'{range}': expected a CPU or a range A-B")),
                };
                for cpu in a..=b {
                    if !allowed.contains(&cpu) {
                        return Err(format!("CPU {cpu} is not available to this process"));
                    }
                    if !set.contains(&cpu) {
                        set.push(cpu);
                    }
                }
            }
            out[q] = Some(set);
        }
        Ok(out)
    }
}

/// The CPUs this process may run on (`sched_getaffinity`).
fn allowed_cpus() -> Result<Vec<usize>, String> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed; pid 0 is
    // the calling thread.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, the set's capacity.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// A whole number of at least `min`.
fn parse_u64(min: u64) -> impl Fn(&str) -> Result<u64, String> {
    move |s| match s.parse::<u64>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!("expected a whole number of at least {min}")),
    }
}

/// One token bucket from `{prefix}_size`, `{prefix}_one_time_burst` and
/// `{prefix}_refill_time` (milliseconds): size and refill time are both
/// needed once any of the three is given.
fn take_bucket(
    kv: &mut KvList,
    keys: [&'static str; 3],
) -> Result<Option<TokenBucketConfig>, ConfigError> {
    let [size_key, burst_key, refill_key] = keys;
    let size = kv.take_parsed(size_key, parse_u64(1))?;
    let burst = kv.take_parsed(burst_key, parse_u64(0))?;
    let refill = kv.take_parsed(refill_key, parse_u64(1))?;
    let missing = |key| KvError::MissingKey {
        option: "--disk",
        key,
    };
    match (size, refill) {
        (None, None) if burst.is_none() => Ok(None),
        (Some(size), Some(refill_time_ms)) => Ok(Some(TokenBucketConfig {
            size,
            one_time_burst: burst.unwrap_or(0),
            refill_time_ms,
        })),
        (None, _) => Err(missing(size_key).into()),
        (_, None) => Err(missing(refill_key).into()),
    }
}

fn parse_count(min: u16, max: u16, power_of_two: bool) -> impl Fn(&str) -> Result<u16, String> {
    move |s| {
        let n: u16 = s
            .parse()
            .map_err(|_| format!("expected a number from {min} to {max}"))?;
        if n < min || n > max {
            return Err(format!("expected a number from {min} to {max}"));
        }
        if power_of_two && !n.is_power_of_two() {
            return Err("expected a power of two".into());
        }
        Ok(n)
    }
}

/// `num_queues` (default 1) and `queue_size` (default 128), shared with
/// vhost-user disks.
pub(super) fn parse_queue_shape(kv: &mut KvList) -> Result<(u16, u16), ConfigError> {
    let num_queues = kv
        .take_parsed("num_queues", parse_count(1, MAX_QUEUES, false))?
        .unwrap_or(1);
    let queue_size = kv
        .take_parsed("queue_size", parse_count(2, MAX_QUEUE_SIZE, true))?
        .unwrap_or(128);
    Ok((num_queues, queue_size))
}

/// `id=NAME`, shared with vhost-user disks.
pub(super) fn parse_disk_id(kv: &mut KvList) -> Result<Option<String>, ConfigError> {
    Ok(kv.take_parsed("id", |s| {
        if s.is_empty()
            || !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        {
            Err("expected letters, digits, '_', '-' or '.'".into())
        } else {
            Ok(s.to_string())
        }
    })?)
}

pub fn parse_disk(s: &str) -> Result<DiskConfig, ConfigError> {
    let mut kv = KvList::parse("--disk", s)?;
    let options = take_image_options(&mut kv)?;
    let (num_queues, queue_size) = parse_queue_shape(&mut kv)?;
    let id = parse_disk_id(&mut kv)?;
    // `vhost_user=off` (or absent) is this parser's; `on` goes to
    // super::vhost_user_disk (see args.rs).
    kv.take_parsed("vhost_user", parse_on_off)?;
    let serial = kv.take_parsed("serial", |s| {
        if s.len() > MAX_SERIAL || !s.bytes().all(|b| b.is_ascii_graphic()) {
            Err(format!(
                "expected at most {MAX_SERIAL} printable ASCII characters"
            ))
        } else {
            Ok(s.to_string())
        }
    })?;
    let rate_limit = RateLimitConfig {
        bandwidth: take_bucket(&mut kv, ["bw_size", "bw_one_time_burst", "bw_refill_time"])?,
        ops: take_bucket(
            &mut kv,
            ["ops_size", "ops_one_time_burst", "ops_refill_time"],
        )?,
    };
    let queue_affinity = kv
        .take_parsed("queue_affinity", parse_queue_affinity(num_queues))?
        .unwrap_or_default();
    let poll_us = kv
        .take_parsed("poll_us", |s| match s.parse::<u32>() {
            Ok(n) if n <= MAX_POLL_US => Ok(n),
            _ => Err(format!("expected a number from 0 to {MAX_POLL_US}")),
        })?
        .unwrap_or(DEFAULT_POLL_US);
    kv.finish()?;
    Ok(DiskConfig {
        options,
        num_queues,
        queue_size,
        id,
        serial,
        rate_limit,
        queue_affinity,
        poll_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::options::CacheMode;
    use block::{EngineKind, ImageType};

    #[test]
    fn all_keys() {
        let d = parse_disk(
            "path=/i.qcow2,readonly=on,direct=on,num_queues=4,queue_size=256,\
             image_type=qcow2,engine=io_uring,id=disk0,serial=ABC123",
        )
        .unwrap();
        assert_eq!(d.options.path.to_str(), Some("/i.qcow2"));
        assert!(d.options.readonly && d.options.direct && d.options.lock);
        assert_eq!(d.options.image_type, ImageType::Qcow2);
        assert_eq!(d.options.engine, EngineKind::IoUring);
        assert_eq!((d.num_queues, d.queue_size), (4, 256));
        assert_eq!(d.id.as_deref(), Some("disk0"));
        assert_eq!(d.serial.as_deref(), Some("ABC123"));
    }

    #[test]
    fn throttling_keys() {
        let d = parse_disk(
            "path=x,bw_size=1048576,bw_refill_time=100,ops_size=100,\
             ops_one_time_burst=50,ops_refill_time=1000",
        )
        .unwrap();
        assert_eq!(
            d.rate_limit.bandwidth,
            Some(TokenBucketConfig {
                size: 1 << 20,
                one_time_burst: 0,
                refill_time_ms: 100
            })
        );
        assert_eq!(
            d.rate_limit.ops,
            Some(TokenBucketConfig {
                size: 100,
                one_time_burst: 50,
                refill_time_ms: 1000
            })
        );
        assert!(!parse_disk("path=x").unwrap().rate_limit.is_enabled());
        // Size and refill time come together.
        for (arg, key) in [
            ("path=x,bw_size=10", "bw_refill_time"),
            ("path=x,ops_refill_time=10", "ops_size"),
            ("path=x,bw_one_time_burst=10", "bw_size"),
        ] {
            assert!(
                matches!(parse_disk(arg), Err(ConfigError::Kv(KvError::MissingKey { key: k, .. })) if k == key),
                "{arg}"
            );
        }
        for (arg, key) in [
            ("path=x,bw_size=0,bw_refill_time=1", "bw_size"),
            ("path=x,ops_size=1,ops_refill_time=0", "ops_refill_time"),
            ("path=x,ops_size=-1,ops_refill_time=1", "ops_size"),
        ] {
            let e = parse_disk(arg).unwrap_err().to_string();
            assert!(e.contains(key), "{arg}: {e}");
        }
    }

    #[test]
    fn queue_affinity() {
        let d = parse_disk("path=x,num_queues=3,queue_affinity=[0@[0],2@[0-1,0]]").unwrap();
        assert_eq!(
            d.queue_affinity,
            vec![Some(vec![0]), None, Some(vec![0, 1])]
        );
        assert!(parse_disk("path=x").unwrap().queue_affinity.is_empty());
        for bad in [
            "path=x,queue_affinity=[1@[0]]",
            "path=x,num_queues=2,queue_affinity=[0@[0],0@[1]]",
            "path=x,queue_affinity=0@[0]",
            "path=x,queue_affinity=[0@0]",
            "path=x,queue_affinity=[0@[1-0]]",
            "path=x,queue_affinity=[0@[100000]]",
            "path=x,queue_affinity=[0@[0]",
        ] {
            let e = parse_disk(bad).unwrap_err().to_string();
            assert!(e.contains("queue_affinity"), "{bad}: {e}");
        }
    }

    #[test]
    fn poll_us() {
        assert_eq!(parse_disk("path=x").unwrap().poll_us, DEFAULT_POLL_US);
        assert_eq!(parse_disk("path=x,poll_us=0").unwrap().poll_us, 0);
        assert_eq!(parse_disk("path=x,poll_us=50").unwrap().poll_us, 50);
        for bad in [
            "path=x,poll_us=1001",
            "path=x,poll_us=-1",
            "path=x,poll_us=a",
        ] {
            let e = parse_disk(bad).unwrap_err().to_string();
            assert!(
                e.contains("poll_us") && e.contains("0 to 1000"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn vhost_user_off_is_an_ordinary_disk() {
        assert_eq!(parse_disk("path=x,vhost_user=off").unwrap().num_queues, 1);
        assert!(parse_disk("path=x,vhost_user=maybe").is_err());
    }

    #[test]
    fn defaults() {
        let d = parse_disk("path=x").unwrap();
        assert!(!d.options.readonly && !d.options.direct);
        assert_eq!(d.options.engine, EngineKind::Auto);
        assert_eq!(d.options.image_type, ImageType::Auto);
        assert_eq!((d.num_queues, d.queue_size), (1, 128));
    }

    #[test]
    fn engines_and_cache_modes() {
        for (arg, engine, cache, direct) in [
            (
                "path=x,engine=threads",
                EngineKind::Threads,
                CacheMode::Writeback,
                false,
            ),
            (
                "path=x,engine=aio,cache=none",
                EngineKind::Aio,
                CacheMode::None,
                true,
            ),
            (
                "path=x,engine=aio,direct=on",
                EngineKind::Aio,
                CacheMode::None,
                true,
            ),
            (
                "path=x,engine=sync,cache=unsafe",
                EngineKind::Sync,
                CacheMode::Unsafe,
                false,
            ),
            (
                "path=x,cache=directsync",
                EngineKind::Auto,
                CacheMode::Directsync,
                true,
            ),
            (
                "path=x,cache=writethrough,direct=off",
                EngineKind::Auto,
                CacheMode::Writethrough,
                false,
            ),
        ] {
            let d = parse_disk(arg).unwrap();
            assert_eq!(
                (d.options.engine, d.options.cache, d.options.direct),
                (engine, cache, direct),
                "{arg}"
            );
        }
    }

    #[test]
    fn errors_name_key_and_value() {
        for (arg, key, value) in [
            ("path=x,engine=native", "engine", "native"),
            ("path=x,cache=nocache", "cache", "nocache"),
            ("path=x,direct=maybe", "direct", "maybe"),
            ("path=x,num_queues=0", "num_queues", "0"),
            ("path=x,queue_size=100", "queue_size", "100"),
            ("path=x,queue_size=1", "queue_size", "1"),
            ("path=x,num_queues=65", "num_queues", "65"),
            ("path=x,readonly=yes", "readonly", "yes"),
            ("path=x,image_type=vmdk", "image_type", "vmdk"),
            (
                "path=x,serial=012345678901234567890",
                "serial",
                "012345678901234567890",
            ),
        ] {
            let e = parse_disk(arg).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(value), "{arg}: {e}");
        }
        // Values that parse but conflict name both keys.
        for (arg, first, second) in [
            (
                "path=x,direct=on,cache=writeback",
                "direct=on",
                "cache=writeback",
            ),
            (
                "path=x,direct=off,cache=directsync",
                "direct=off",
                "cache=directsync",
            ),
            ("path=x,engine=aio", "engine=aio", "cache=writeback"),
            (
                "path=x,engine=aio,cache=unsafe",
                "engine=aio",
                "cache=unsafe",
            ),
            ("path=x,engine=aio,direct=off", "engine=aio", "direct=off"),
        ] {
            let e = parse_disk(arg).unwrap_err().to_string();
            assert!(e.contains(first) && e.contains(second), "{arg}: {e}");
        }
        assert!(matches!(
            parse_disk("readonly=on"),
            Err(ConfigError::Kv(KvError::MissingKey { key: "path", .. }))
        ));
    }
}
