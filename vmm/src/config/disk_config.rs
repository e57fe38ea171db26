//! Cloud Hypervisor's `DiskConfig`: the one description of a disk that
//! the command line and the API share. `--disk KEY=VALUE,...` is parsed
//! into it ([`super::disk::parse_disk`]), `vm.add-disk`'s JSON body is
//! deserialized into it by serde, `ch-remote add-disk` serializes it, and
//! `vm.info` shows each disk as one (built from what the disk runs with,
//! [`DiskConfig::from_local`], [`DiskConfig::from_vhost_user`]).
//!
//! The fields and their JSON names are upstream's (v54), each with its
//! default, so any body its clients send deserializes; ours follow them
//! (`cache`, `engine`, `poll_us`, `reconnect_delay`). A value here is
//! only well-typed: what it means, and whether this VMM can do it, is
//! decided once, by [`super::disk_resolve`], for both ways in.

use serde::{Deserialize, Serialize};

use super::local_disk::LocalDiskConfig;
use super::vhost_user_disk::VhostUserDiskConfig;

/// Which format the image is in (`Unknown`: probe it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageTypeName {
    FlatVmdk,
    FixedVhd,
    #[serde(alias = "qcow2")]
    Qcow2,
    #[serde(alias = "raw")]
    Raw,
    Vhdx,
    #[default]
    #[serde(alias = "auto")]
    Unknown,
}

impl ImageTypeName {
    /// The format's name in the block layer's registry of formats
    /// (`None`: probe). A format the registry does not have opens as
    /// probed (the resolver refuses those first).
    pub fn format_name(self) -> Option<&'static str> {
        match self {
            ImageTypeName::Raw => Some("raw"),
            ImageTypeName::Qcow2 => Some("qcow2"),
            ImageTypeName::FixedVhd => Some("vpc"),
            ImageTypeName::Vhdx => Some("vhdx"),
            ImageTypeName::FlatVmdk => Some("vmdk"),
            ImageTypeName::Unknown => None,
        }
    }
}

/// How the image file is locked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockGranularity {
    /// Locks on qemu's byte offsets (what this VMM does).
    #[default]
    ByteRange,
    /// One lock over the whole file.
    Full,
}

/// One token bucket (`refill_time` in milliseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBucket {
    pub size: u64,
    #[serde(default)]
    pub one_time_burst: u64,
    pub refill_time: u64,
}

/// Throttling of each of the disk's queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RateLimiterConfig {
    pub bandwidth: Option<TokenBucket>,
    pub ops: Option<TokenBucket>,
}

/// The host CPUs one queue's worker may run on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueAffinity {
    pub queue_index: usize,
    pub host_cpus: Vec<usize>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A disk as asked for (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiskConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "is_false")]
    pub iommu: bool,
    pub pci_segment: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_device_id: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub readonly: bool,
    /// `None`: as the cache mode says (O_DIRECT for `none`/`directsync`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct: Option<bool>,
    pub num_queues: usize,
    pub queue_size: u16,
    pub vhost_user: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vhost_socket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit_group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limiter_config: Option<RateLimiterConfig>,
    pub disable_io_uring: bool,
    pub disable_aio: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_affinity: Option<Vec<QueueAffinity>>,
    /// `None`: backing files are followed (our default); `Some(false)`
    /// refuses an image that has one (upstream's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backing_files: Option<bool>,
    pub sparse: bool,
    pub image_type: ImageTypeName,
    pub lock_granularity: LockGranularity,
    /// Ours: QEMU's cache mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// Ours: the I/O engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Ours: the queue workers' spin ceiling in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_us: Option<u32>,
    /// Ours: how long an NBD export's requests wait for a reconnection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reconnect_delay: Option<u64>,
}

impl Default for DiskConfig {
    fn default() -> Self {
        DiskConfig {
            id: None,
            iommu: false,
            pci_segment: 0,
            pci_device_id: None,
            path: None,
            readonly: false,
            direct: None,
            num_queues: 1,
            queue_size: 128,
            vhost_user: false,
            vhost_socket: None,
            rate_limit_group: None,
            rate_limiter_config: None,
            disable_io_uring: false,
            disable_aio: false,
            serial: None,
            queue_affinity: None,
            backing_files: None,
            sparse: true,
            image_type: ImageTypeName::Unknown,
            lock_granularity: LockGranularity::ByteRange,
            cache: None,
            engine: None,
            poll_us: None,
            reconnect_delay: None,
        }
    }
}

impl DiskConfig {
    /// An in-VMM disk as it runs; `image_type` is the probed format.
    pub fn from_local(c: &LocalDiskConfig, image_type: ImageTypeName) -> Self {
        use block::EngineKind;
        let o = &c.options;
        let bucket = |b: &virtio_devices::block::rate_limit::TokenBucketConfig| TokenBucket {
            size: b.size,
            one_time_burst: b.one_time_burst,
            refill_time: b.refill_time_ms,
        };
        let rate = &c.rate_limit;
        let affinity: Vec<QueueAffinity> = c
            .queue_affinity
            .iter()
            .enumerate()
            .filter_map(|(q, cpus)| {
                cpus.as_ref().map(|cpus| QueueAffinity {
                    queue_index: q,
                    host_cpus: cpus.clone(),
                })
            })
            .collect();
        // What the engine rules out, in upstream's terms.
        let (disable_io_uring, disable_aio) = match o.engine {
            EngineKind::Auto | EngineKind::IoUring => (false, false),
            EngineKind::Aio => (true, false),
            EngineKind::Threads | EngineKind::Sync => (true, true),
        };
        DiskConfig {
            id: c.id.clone(),
            path: Some(o.path.display().to_string()),
            readonly: o.readonly,
            direct: Some(o.direct),
            num_queues: usize::from(c.num_queues),
            queue_size: c.queue_size,
            rate_limiter_config: rate.is_enabled().then(|| RateLimiterConfig {
                bandwidth: rate.bandwidth.as_ref().map(bucket),
                ops: rate.ops.as_ref().map(bucket),
            }),
            disable_io_uring,
            disable_aio,
            serial: c.serial.clone(),
            queue_affinity: (!affinity.is_empty()).then_some(affinity),
            backing_files: Some(c.backing_files),
            image_type,
            cache: Some(o.cache.as_str().to_string()),
            engine: Some(o.engine.as_str().to_string()),
            poll_us: Some(c.poll_us),
            reconnect_delay: (o.reconnect_delay != 0).then_some(o.reconnect_delay),
            ..DiskConfig::default()
        }
    }

    /// A disk a vhost-user backend serves.
    pub fn from_vhost_user(c: &VhostUserDiskConfig) -> Self {
        DiskConfig {
            id: c.id.clone(),
            num_queues: usize::from(c.num_queues),
            queue_size: c.queue_size,
            vhost_user: true,
            vhost_socket: Some(c.socket.display().to_string()),
            ..DiskConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_upstream_sends_is_read() {
        // What upstream's ch-remote sends for `add-disk path=/x/y.qcow2,
        // id=h,num_queues=2,direct=on,readonly=on,bw_size=100,
        // bw_refill_time=10`.
        let body = r#"{"id":"h","pci_segment":0,"path":"/x/y.qcow2","readonly":true,
            "direct":true,"num_queues":2,"queue_size":128,"vhost_user":false,
            "rate_limiter_config":{"bandwidth":{"size":100,"one_time_burst":0,
            "refill_time":10},"ops":null},"disable_io_uring":false,
            "disable_aio":false,"backing_files":false,"sparse":true,
            "image_type":"Unknown","lock_granularity":"ByteRange"}"#;
        let c: DiskConfig = serde_json::from_str(body).unwrap();
        assert_eq!(c.id.as_deref(), Some("h"));
        assert_eq!((c.num_queues, c.direct, c.readonly), (2, Some(true), true));
        assert_eq!(c.rate_limiter_config.unwrap().bandwidth.unwrap().size, 100);
        assert_eq!(c.backing_files, Some(false));
        // Every field has a default.
        let c: DiskConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, DiskConfig::default());
        assert_eq!((c.num_queues, c.queue_size, c.sparse), (1, 128, true));
        // Types are checked.
        for bad in [
            r#"{"path":7}"#,
            r#"{"num_queues":-1}"#,
            r#"{"image_type":"Vmdk4"}"#,
        ] {
            assert!(serde_json::from_str::<DiskConfig>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn serializes_with_upstreams_names() {
        let c = DiskConfig {
            path: Some("/a".into()),
            ..DiskConfig::default()
        };
        let v = serde_json::to_value(&c).unwrap();
        for key in [
            "pci_segment",
            "path",
            "readonly",
            "num_queues",
            "queue_size",
            "vhost_user",
            "disable_io_uring",
            "disable_aio",
            "sparse",
            "image_type",
            "lock_granularity",
        ] {
            assert!(v.get(key).is_some(), "{key} missing: {v}");
        }
        assert!(v.get("iommu").is_none(), "iommu is left out when false");
        assert_eq!(v["image_type"], "Unknown");
        let back: DiskConfig = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
    }
}
