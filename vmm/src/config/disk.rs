//! `--disk`: one virtio-blk device, in Cloud Hypervisor's `key=value`
//! syntax, parsed into the same [`DiskConfig`] the API's `vm.add-disk`
//! body is (the checks and the meaning of each key are
//! [`super::disk_resolve`]'s, once for both).
//!
//! Keys (upstream's): `path`, `readonly`, `direct`, `iommu`, `num_queues`,
//! `queue_size`, `vhost_user`, `socket`, the throttling keys `bw_size`,
//! `bw_one_time_burst`, `bw_refill_time`, `ops_size`,
//! `ops_one_time_burst`, `ops_refill_time`, `id`, `pci_segment`,
//! `pci_device_id`, `rate_limit_group`, `queue_affinity=[QUEUE@[CPUS],...]`
//! (CPUS: numbers and ranges), `serial`, `backing_files`, `sparse`,
//! `image_type`, `lock_granularity`; ours: `cache` (QEMU's five modes),
//! `engine` (auto, io_uring, aio, threads, sync), `poll_us=N` (0 to
//! 1000, default 32: the ceiling of each queue worker's adaptive spin
//! before it sleeps; docs/disk-options.md, "Polling"; QEMU's iothread
//! `poll-max-ns` plays this part) and `reconnect_delay` (NBD paths).
//!
//! Enters as the option's string; leaves as a [`DiskConfig`] whose
//! values are well-typed (numbers are numbers, `on|off` a bool). What a
//! disk is built from after the checks is a
//! [`super::local_disk::LocalDiskConfig`]. Nothing is opened here.

use ch_util::kv::{parse_on_off, split_top_level, KvError, KvList};

use super::disk_config::{
    DiskConfig, ImageTypeName, LockGranularity, QueueAffinity, RateLimiterConfig, TokenBucket,
};
use super::error::ConfigError;
use super::local_disk::MAX_POLL_US;

/// `[0@[0,2-3],1@[1]]`: for each listed queue, its host CPUs (ranges
/// expanded, in order, each once). Which queues and CPUs are allowed is
/// checked later.
fn parse_queue_affinity(s: &str) -> Result<Vec<QueueAffinity>, String> {
    let inner = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or("expected [QUEUE@[CPUS],...]")?;
    let mut out = Vec::new();
    for item in split_top_level(inner).ok_or("unbalanced brackets")? {
        let (queue, cpus) = item
            .split_once('@')
            .ok_or_else(|| format!("'{item}': expected QUEUE@[CPUS]"))?;
        let queue_index: usize = queue
            .parse()
            .map_err(|_| format!("queue '{queue}': expected a queue number"))?;
        let list = cpus
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .ok_or_else(|| format!("'{cpus}': expected [CPUS]"))?;
        let mut host_cpus = Vec::new();
        for range in list.split(',') {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b): (usize, usize) = match (a.parse(), b.parse()) {
                (Ok(a), Ok(b)) if a <= b => (a, b),
                _ => return Err(format!("'{range}': expected a CPU or a range A-B")),
            };
            if b - a >= 4096 {
                return Err(format!("'{range}': more than 4096 CPUs"));
            }
            for cpu in a..=b {
                if !host_cpus.contains(&cpu) {
                    host_cpus.push(cpu);
                }
            }
        }
        out.push(QueueAffinity {
            queue_index,
            host_cpus,
        });
    }
    Ok(out)
}

/// A whole number of at least `min`.
fn parse_u64(min: u64) -> impl Fn(&str) -> Result<u64, String> {
    move |s| match s.parse::<u64>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!("expected a whole number of at least {min}")),
    }
}

fn parse_number<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| "expected a whole number".to_string())
}

/// One token bucket from `{prefix}_size`, `{prefix}_one_time_burst` and
/// `{prefix}_refill_time` (milliseconds): size and refill time are both
/// needed once any of the three is given.
fn take_bucket(kv: &mut KvList, keys: [&'static str; 3]) -> Result<Option<TokenBucket>, KvError> {
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
        (Some(size), Some(refill_time)) => Ok(Some(TokenBucket {
            size,
            one_time_burst: burst.unwrap_or(0),
            refill_time,
        })),
        (None, _) => Err(missing(size_key)),
        (_, None) => Err(missing(refill_key)),
    }
}

fn parse_image_type(s: &str) -> Result<ImageTypeName, String> {
    match s {
        "auto" => Ok(ImageTypeName::Unknown),
        "raw" => Ok(ImageTypeName::Raw),
        "qcow2" => Ok(ImageTypeName::Qcow2),
        "vhd" => Ok(ImageTypeName::FixedVhd),
        "vhdx" => Ok(ImageTypeName::Vhdx),
        _ => Err("expected auto, raw or qcow2".into()),
    }
}

/// `--disk`'s string as a [`DiskConfig`] (syntax and types only).
pub fn parse_disk(s: &str) -> Result<DiskConfig, ConfigError> {
    let mut kv = KvList::parse("--disk", s)?;
    let text = |v: &str| Ok::<_, String>(v.to_string());
    let defaults = DiskConfig::default();
    let mut c = DiskConfig {
        path: kv.take("path")?,
        readonly: kv.take_parsed("readonly", parse_on_off)?.unwrap_or(false),
        direct: kv.take_parsed("direct", parse_on_off)?,
        iommu: kv.take_parsed("iommu", parse_on_off)?.unwrap_or(false),
        num_queues: kv
            .take_parsed("num_queues", parse_number)?
            .unwrap_or(defaults.num_queues),
        queue_size: kv
            .take_parsed("queue_size", parse_number)?
            .unwrap_or(defaults.queue_size),
        vhost_user: kv.take_parsed("vhost_user", parse_on_off)?.unwrap_or(false),
        vhost_socket: kv.take_parsed("socket", text)?,
        id: kv.take_parsed("id", text)?,
        pci_segment: kv.take_parsed("pci_segment", parse_number)?.unwrap_or(0),
        pci_device_id: kv.take_parsed("pci_device_id", parse_number)?,
        rate_limit_group: kv.take_parsed("rate_limit_group", text)?,
        queue_affinity: kv.take_parsed("queue_affinity", parse_queue_affinity)?,
        serial: kv.take_parsed("serial", text)?,
        backing_files: kv.take_parsed("backing_files", parse_on_off)?,
        sparse: kv.take_parsed("sparse", parse_on_off)?.unwrap_or(true),
        image_type: kv
            .take_parsed("image_type", parse_image_type)?
            .unwrap_or_default(),
        lock_granularity: kv
            .take_parsed("lock_granularity", |v| match v {
                "byte-range" => Ok(LockGranularity::ByteRange),
                "full" => Ok(LockGranularity::Full),
                _ => Err("expected byte-range or full".to_string()),
            })?
            .unwrap_or_default(),
        cache: kv.take("cache")?,
        engine: kv.take("engine")?,
        poll_us: kv.take_parsed("poll_us", |v| {
            v.parse::<u32>()
                .map_err(|_| format!("expected a number from 0 to {MAX_POLL_US}"))
        })?,
        reconnect_delay: kv.take_parsed("reconnect_delay", parse_number)?,
        ..defaults
    };
    let bandwidth = take_bucket(&mut kv, ["bw_size", "bw_one_time_burst", "bw_refill_time"])?;
    let ops = take_bucket(
        &mut kv,
        ["ops_size", "ops_one_time_burst", "ops_refill_time"],
    )?;
    if bandwidth.is_some() || ops.is_some() {
        c.rate_limiter_config = Some(RateLimiterConfig { bandwidth, ops });
    }
    kv.finish()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::disk_resolve::{DiskConfigError, ResolvedDisk};
    use crate::config::local_disk::LocalDiskConfig;
    use block::options::CacheMode;
    use block::{EngineKind, ImageType};
    use virtio_devices::block::rate_limit::TokenBucketConfig;
    use virtio_devices::block::DEFAULT_POLL_US;

    /// `--disk`'s string parsed and resolved as a local disk.
    fn parse_local(s: &str) -> Result<LocalDiskConfig, ConfigError> {
        match parse_disk(s)?.resolve()? {
            ResolvedDisk::Local(l) => Ok(*l),
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn all_keys() {
        let d = parse_local(
            "path=/i.qcow2,readonly=on,direct=on,num_queues=4,queue_size=256,\
             image_type=qcow2,engine=io_uring,id=disk0,serial=ABC123",
        )
        .unwrap();
        assert_eq!(d.options.path.to_str(), Some("/i.qcow2"));
        assert!(d.options.readonly && d.options.direct && d.options.lock);
        assert_eq!(d.options.image_type, ImageType::Format("qcow2"));
        assert_eq!(d.options.engine, EngineKind::IoUring);
        assert_eq!((d.num_queues, d.queue_size), (4, 256));
        assert_eq!(d.id.as_deref(), Some("disk0"));
        assert_eq!(d.serial.as_deref(), Some("ABC123"));
    }

    #[test]
    fn throttling_keys() {
        let d = parse_local(
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
        assert!(!parse_local("path=x").unwrap().rate_limit.is_enabled());
        // Size and refill time come together.
        for (arg, key) in [
            ("path=x,bw_size=10", "bw_refill_time"),
            ("path=x,ops_refill_time=10", "ops_size"),
            ("path=x,bw_one_time_burst=10", "bw_size"),
        ] {
            assert!(
                matches!(parse_local(arg), Err(ConfigError::Kv(KvError::MissingKey { key: k, .. })) if k == key),
                "{arg}"
            );
        }
        for (arg, key) in [
            ("path=x,bw_size=0,bw_refill_time=1", "bw_size"),
            ("path=x,ops_size=1,ops_refill_time=0", "ops_refill_time"),
            ("path=x,ops_size=-1,ops_refill_time=1", "ops_size"),
        ] {
            let e = parse_local(arg).unwrap_err().to_string();
            assert!(e.contains(key), "{arg}: {e}");
        }
    }

    #[test]
    fn queue_affinity() {
        let d = parse_local("path=x,num_queues=3,queue_affinity=[0@[0],2@[0-1,0]]").unwrap();
        assert_eq!(
            d.queue_affinity,
            vec![Some(vec![0]), None, Some(vec![0, 1])]
        );
        assert!(parse_local("path=x").unwrap().queue_affinity.is_empty());
        for bad in [
            "path=x,queue_affinity=[1@[0]]",
            "path=x,num_queues=2,queue_affinity=[0@[0],0@[1]]",
            "path=x,queue_affinity=0@[0]",
            "path=x,queue_affinity=[0@0]",
            "path=x,queue_affinity=[0@[1-0]]",
            "path=x,queue_affinity=[0@[100000]]",
            "path=x,queue_affinity=[0@[0]",
        ] {
            let e = parse_local(bad).unwrap_err().to_string();
            assert!(e.contains("queue_affinity"), "{bad}: {e}");
        }
    }

    #[test]
    fn poll_us() {
        assert_eq!(parse_local("path=x").unwrap().poll_us, DEFAULT_POLL_US);
        assert_eq!(parse_local("path=x,poll_us=0").unwrap().poll_us, 0);
        assert_eq!(parse_local("path=x,poll_us=50").unwrap().poll_us, 50);
        for bad in [
            "path=x,poll_us=1001",
            "path=x,poll_us=-1",
            "path=x,poll_us=a",
        ] {
            let e = parse_local(bad).unwrap_err().to_string();
            assert!(
                e.contains("poll_us") && e.contains("0 to 1000"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn vhost_user_off_is_an_ordinary_disk() {
        assert_eq!(parse_local("path=x,vhost_user=off").unwrap().num_queues, 1);
        assert!(parse_local("path=x,vhost_user=maybe").is_err());
    }

    #[test]
    fn defaults() {
        let d = parse_local("path=x").unwrap();
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
            let d = parse_local(arg).unwrap();
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
            let e = parse_local(arg).unwrap_err().to_string();
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
            let e = parse_local(arg).unwrap_err().to_string();
            assert!(e.contains(first) && e.contains(second), "{arg}: {e}");
        }
        assert!(matches!(
            parse_local("readonly=on"),
            Err(ConfigError::Disk(DiskConfigError::Missing("path")))
        ));
    }

    // vhost-user disks: the same parser, resolved to a backend's disk.
    use crate::config::vhost_user_disk::VhostUserDiskConfig;

    fn resolve(s: &str) -> Result<ResolvedDisk, String> {
        parse_disk(s)
            .map_err(|e| e.to_string())?
            .resolve()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn keys_and_defaults() {
        let Ok(ResolvedDisk::VhostUser(d)) =
            resolve("vhost_user=on,socket=/s,num_queues=2,queue_size=256,id=d")
        else {
            panic!("not a vhost-user disk")
        };
        assert_eq!(
            d,
            VhostUserDiskConfig {
                socket: "/s".into(),
                num_queues: 2,
                queue_size: 256,
                id: Some("d".into()),
            }
        );
        let Ok(ResolvedDisk::VhostUser(d)) = resolve("vhost_user=true,socket=/s") else {
            panic!("not a vhost-user disk")
        };
        assert_eq!((d.num_queues, d.queue_size), (1, 128));
        assert!(matches!(
            resolve("path=x,vhost_user=off"),
            Ok(ResolvedDisk::Local(_))
        ));
    }

    #[test]
    fn refuses_backend_keys_and_missing_socket() {
        for (kv, key) in [
            ("path=x", "path"),
            ("readonly=on", "readonly"),
            ("direct=on", "direct"),
            ("cache=none", "cache"),
            ("image_type=qcow2", "image_type"),
            ("engine=sync", "engine"),
            ("serial=x", "serial"),
            ("bw_size=1,bw_refill_time=1", "rate_limiter_config"),
            ("ops_size=1,ops_refill_time=1", "rate_limiter_config"),
            ("queue_affinity=[0@[0]]", "queue_affinity"),
            ("poll_us=1", "poll_us"),
            ("backing_files=on", "backing_files"),
        ] {
            let e = resolve(&format!("vhost_user=on,socket=/s,{kv}")).unwrap_err();
            assert!(e.contains(key) && e.contains("backend"), "{kv}: {e}");
        }
        for (s, word) in [
            ("vhost_user=on", "socket"),
            ("vhost_user=on,socket=/s,num_queues=0", "num_queues"),
            ("vhost_user=on,socket=/s,bogus=1", "bogus"),
            ("vhost_user=maybe", "vhost_user"),
        ] {
            let e = resolve(s).unwrap_err();
            assert!(e.contains(word), "{s}: {e}");
        }
    }
}
