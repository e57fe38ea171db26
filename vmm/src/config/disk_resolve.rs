//! What a [`DiskConfig`] means here: the one place its values are
//! checked and turned into what a disk is built from, for `--disk` and
//! for `vm.add-disk` alike. A value this VMM can honour becomes part of
//! a [`LocalDiskConfig`] (or a [`VhostUserDiskConfig`]); one it cannot
//! is refused by name ([`DiskConfigError`]), never ignored.
//!
//! Upstream's `disable_io_uring` / `disable_aio` pick the engine when
//! `engine` is not given: both off (the default) leave the choice to
//! `auto`; `disable_io_uring` picks the thread pool; `disable_aio` alone
//! keeps `auto` away from Linux AIO (io_uring where the kernel has it,
//! else the thread pool). An explicit `engine` they rule out is a
//! conflict. The `direct`/`cache`, `engine=aio` and `reconnect_delay`
//! rules are `block::options::rules`, which `--image` and `ch-img` go
//! through too.

use block::formats::FORMATS;
use block::options::rules::{check_reconnect_delay, CacheKeys, KeyConflict};
use block::options::{is_nbd_path, CacheMode};
use block::{DiskOptions, EngineKind, ImageType};
use thiserror::Error;
use virtio_devices::block::rate_limit::{RateLimitConfig, TokenBucketConfig};
use virtio_devices::block::DEFAULT_POLL_US;

use super::disk_config::{DiskConfig, ImageTypeName, LockGranularity, TokenBucket};
use super::local_disk::{LocalDiskConfig, MAX_POLL_US, MAX_QUEUES, MAX_QUEUE_SIZE, MAX_SERIAL};
use super::vhost_user_disk::VhostUserDiskConfig;

/// A disk configuration that cannot be used; each names the field.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiskConfigError {
    #[error("missing required key '{0}'")]
    Missing(&'static str),
    #[error("bad value '{value}' for '{field}': {reason}")]
    BadValue {
        field: &'static str,
        value: String,
        reason: String,
    },
    /// A value upstream accepts that this VMM cannot honour.
    #[error("'{field}' = {value} is not supported: {reason}")]
    Unsupported {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    /// Two values that each parse but cannot be used together.
    #[error("'{first}' and '{second}' conflict: {reason}")]
    Conflict {
        first: String,
        second: String,
        reason: String,
    },
}

/// What a [`DiskConfig`] resolves to.
#[derive(Clone, Debug)]
pub enum ResolvedDisk {
    /// Boxed: the image options make it far larger than the other.
    Local(Box<LocalDiskConfig>),
    VhostUser(VhostUserDiskConfig),
}

fn bad(field: &'static str, value: impl ToString, reason: impl Into<String>) -> DiskConfigError {
    DiskConfigError::BadValue {
        field,
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn unsupported(field: &'static str, value: impl ToString, reason: &'static str) -> DiskConfigError {
    DiskConfigError::Unsupported {
        field,
        value: value.to_string(),
        reason,
    }
}

fn conflict(c: KeyConflict) -> DiskConfigError {
    DiskConfigError::Conflict {
        first: c.first,
        second: c.second,
        reason: c.reason,
    }
}

/// The fields a vhost-user disk leaves to its backend, when set.
fn backend_fields(c: &DiskConfig) -> Vec<&'static str> {
    [
        ("path", c.path.is_some()),
        ("readonly", c.readonly),
        ("direct", c.direct.is_some()),
        ("cache", c.cache.is_some()),
        ("image_type", c.image_type != ImageTypeName::Unknown),
        ("engine", c.engine.is_some()),
        ("serial", c.serial.is_some()),
        ("rate_limiter_config", c.rate_limiter_config.is_some()),
        ("queue_affinity", c.queue_affinity.is_some()),
        ("poll_us", c.poll_us.is_some()),
        ("reconnect_delay", c.reconnect_delay.is_some()),
        ("backing_files", c.backing_files.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect()
}

impl DiskConfig {
    /// Checks every value and builds what the disk is made from.
    pub fn resolve(&self) -> Result<ResolvedDisk, DiskConfigError> {
        self.refuse_what_cannot_be_honoured()?;
        let id = self.checked_id()?;
        let num_queues = match u16::try_from(self.num_queues) {
            Ok(n) if (1..=MAX_QUEUES).contains(&n) => n,
            _ => {
                return Err(bad(
                    "num_queues",
                    self.num_queues,
                    format!("expected a number from 1 to {MAX_QUEUES}"),
                ))
            }
        };
        let queue_size = self.queue_size;
        if !(2..=MAX_QUEUE_SIZE).contains(&queue_size) || !queue_size.is_power_of_two() {
            return Err(bad(
                "queue_size",
                queue_size,
                format!("expected a power of two from 2 to {MAX_QUEUE_SIZE}"),
            ));
        }
        if self.vhost_user {
            if let Some(field) = backend_fields(self).first() {
                return Err(DiskConfigError::Conflict {
                    first: "vhost_user=on".into(),
                    second: (*field).into(),
                    reason: format!(
                        "'{field}' belongs to the vhost-user backend (give it to the backend, e.g. ch-storage-daemon --image/--export)"
                    ),
                });
            }
            let socket = match self.vhost_socket.as_deref() {
                Some(s) if !s.is_empty() => s,
                Some(s) => return Err(bad("socket", s, "empty path")),
                None => return Err(DiskConfigError::Missing("socket")),
            };
            return Ok(ResolvedDisk::VhostUser(VhostUserDiskConfig {
                socket: socket.into(),
                num_queues,
                queue_size,
                id,
            }));
        }
        if let Some(s) = &self.vhost_socket {
            return Err(DiskConfigError::Conflict {
                first: format!("socket={s}"),
                second: "vhost_user=off".into(),
                reason: "a socket serves vhost-user disks only".into(),
            });
        }
        Ok(ResolvedDisk::Local(Box::new(LocalDiskConfig {
            options: self.image_options()?,
            num_queues,
            queue_size,
            id,
            serial: self.checked_serial()?,
            rate_limit: self.rate_limit()?,
            queue_affinity: self.checked_affinity(num_queues)?,
            poll_us: match self.poll_us {
                None => DEFAULT_POLL_US,
                Some(n) if n <= MAX_POLL_US => n,
                Some(n) => {
                    return Err(bad(
                        "poll_us",
                        n,
                        format!("expected a number from 0 to {MAX_POLL_US}"),
                    ))
                }
            },
            backing_files: self.backing_files.unwrap_or(true),
        })))
    }

    /// Upstream's values this VMM has no way to honour.
    fn refuse_what_cannot_be_honoured(&self) -> Result<(), DiskConfigError> {
        if self.iommu {
            return Err(unsupported("iommu", "true", "there is no virtual IOMMU"));
        }
        if self.pci_segment != 0 {
            return Err(unsupported(
                "pci_segment",
                self.pci_segment,
                "only PCI segment 0 exists",
            ));
        }
        if let Some(slot) = self.pci_device_id {
            return Err(unsupported(
                "pci_device_id",
                slot,
                "a disk takes the first free PCI slot",
            ));
        }
        if let Some(g) = &self.rate_limit_group {
            return Err(unsupported(
                "rate_limit_group",
                g,
                "there are no rate-limit groups here; use rate_limiter_config (bw_*/ops_* keys)",
            ));
        }
        if !self.sparse {
            return Err(unsupported(
                "sparse",
                "false",
                "discards and write-zeroes always deallocate where the format can",
            ));
        }
        if self.lock_granularity == LockGranularity::Full {
            return Err(unsupported(
                "lock_granularity",
                "Full",
                "images are locked on qemu's byte ranges (ByteRange), so qemu-img sees the locks",
            ));
        }
        if matches!(
            self.image_type,
            ImageTypeName::FlatVmdk | ImageTypeName::FixedVhd | ImageTypeName::Vhdx
        ) {
            return Err(unsupported(
                "image_type",
                format!("{:?}", self.image_type),
                "only Raw and Qcow2 images (or Unknown: probe)",
            ));
        }
        Ok(())
    }

    fn checked_id(&self) -> Result<Option<String>, DiskConfigError> {
        match &self.id {
            Some(s)
                if s.is_empty()
                    || !s
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) =>
            {
                Err(bad("id", s, "expected letters, digits, '_', '-' or '.'"))
            }
            other => Ok(other.clone()),
        }
    }

    fn checked_serial(&self) -> Result<Option<String>, DiskConfigError> {
        match &self.serial {
            Some(s) if s.len() > MAX_SERIAL || !s.bytes().all(|b| b.is_ascii_graphic()) => {
                Err(bad(
                    "serial",
                    s,
                    format!("expected at most {MAX_SERIAL} printable ASCII characters"),
                ))
            }
            other => Ok(other.clone()),
        }
    }

    /// Path, access, cache mode, format and engine.
    fn image_options(&self) -> Result<DiskOptions, DiskConfigError> {
        let path = match self.path.as_deref() {
            None => return Err(DiskConfigError::Missing("path")),
            Some("") => return Err(bad("path", "", "empty path")),
            Some(p) => p,
        };
        let mut o = DiskOptions::new(path);
        o.readonly = self.readonly;
        // The VMM records guest writes in the image's persistent dirty
        // bitmaps (docs/backup.md), so a writable open keeps them valid.
        o.records_bitmaps = !o.readonly;
        let keys = CacheKeys {
            direct: self.direct,
            cache: match &self.cache {
                None => None,
                Some(c) => Some(c.parse::<CacheMode>().map_err(|e| bad("cache", c, e))?),
            },
        };
        o.cache = keys.mode().map_err(conflict)?;
        o.direct = o.cache.direct();
        o.image_type = (self.image_type.format_name())
            .and_then(|name| FORMATS.image_type(name))
            .unwrap_or(ImageType::Auto);
        o.engine = self.engine_kind(o.direct)?;
        if let Some(d) = self.reconnect_delay {
            o.reconnect_delay = check_reconnect_delay(d, is_nbd_path(&o.path))
                .map_err(|reason| bad("reconnect_delay", d, reason))?;
        }
        if o.engine == EngineKind::Aio {
            keys.check_aio().map_err(conflict)?;
        }
        Ok(o)
    }

    /// `engine`, or what `disable_io_uring`/`disable_aio` leave.
    fn engine_kind(&self, direct: bool) -> Result<EngineKind, DiskConfigError> {
        let asked = match &self.engine {
            Some(e) => Some(e.parse::<EngineKind>().map_err(|r| bad("engine", e, r))?),
            None => None,
        };
        let conflict = |field: &str, kind: EngineKind| DiskConfigError::Conflict {
            first: format!("engine={kind}"),
            second: format!("{field}=true"),
            reason: format!("{field} rules out the engine asked for"),
        };
        match asked {
            Some(k @ EngineKind::IoUring) if self.disable_io_uring => {
                Err(conflict("disable_io_uring", k))
            }
            Some(k @ EngineKind::Aio) if self.disable_aio => Err(conflict("disable_aio", k)),
            Some(k) => Ok(k),
            None if self.disable_io_uring => Ok(EngineKind::Threads),
            // `auto` picks Linux AIO only for O_DIRECT without io_uring.
            None if self.disable_aio && direct => {
                Ok(match block::engines::probe::uring_support() {
                    Ok(()) => EngineKind::IoUring,
                    Err(_) => EngineKind::Threads,
                })
            }
            None => Ok(EngineKind::Auto),
        }
    }

    fn rate_limit(&self) -> Result<RateLimitConfig, DiskConfigError> {
        let Some(r) = &self.rate_limiter_config else {
            return Ok(RateLimitConfig::default());
        };
        let bucket = |b: &Option<TokenBucket>, fields: [&'static str; 2]| match b {
            None => Ok(None),
            Some(b) if b.size == 0 => Err(bad(fields[0], 0, "expected at least 1")),
            Some(b) if b.refill_time == 0 => Err(bad(fields[1], 0, "expected at least 1 ms")),
            Some(b) => Ok(Some(TokenBucketConfig {
                size: b.size,
                one_time_burst: b.one_time_burst,
                refill_time_ms: b.refill_time,
            })),
        };
        Ok(RateLimitConfig {
            bandwidth: bucket(&r.bandwidth, ["bw_size", "bw_refill_time"])?,
            ops: bucket(&r.ops, ["ops_size", "ops_refill_time"])?,
        })
    }

    /// Host CPUs per queue: each queue below `num_queues` at most once,
    /// each CPU one this process may use.
    fn checked_affinity(
        &self,
        num_queues: u16,
    ) -> Result<Vec<Option<Vec<usize>>>, DiskConfigError> {
        let Some(list) = &self.queue_affinity else {
            return Ok(Vec::new());
        };
        let allowed = allowed_cpus().map_err(|e| bad("queue_affinity", "", e))?;
        let mut out = vec![None; usize::from(num_queues)];
        for a in list {
            let q = a.queue_index;
            let slot = out.get_mut(q).ok_or_else(|| {
                bad(
                    "queue_affinity",
                    q,
                    format!("queue {q}: expected 0 to {}", num_queues - 1),
                )
            })?;
            if slot.is_some() {
                return Err(bad(
                    "queue_affinity",
                    q,
                    format!("queue {q} is given twice"),
                ));
            }
            let mut cpus: Vec<usize> = Vec::new();
            for &cpu in &a.host_cpus {
                if !allowed.contains(&cpu) {
                    return Err(bad(
                        "queue_affinity",
                        cpu,
                        format!("CPU {cpu} is not available to this process"),
                    ));
                }
                if !cpus.contains(&cpu) {
                    cpus.push(cpu);
                }
            }
            if cpus.is_empty() {
                return Err(bad("queue_affinity", q, format!("queue {q}: no CPUs")));
            }
            *slot = Some(cpus);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn json(s: &str) -> Result<ResolvedDisk, DiskConfigError> {
        serde_json::from_str::<DiskConfig>(s).unwrap().resolve()
    }

    fn local(s: &str) -> LocalDiskConfig {
        match json(s).unwrap() {
            ResolvedDisk::Local(l) => *l,
            other => panic!("{s}: {other:?}"),
        }
    }

    #[test]
    fn upstream_fields_are_honoured() {
        let d = local(
            r#"{"path":"/i.qcow2","readonly":true,"direct":true,"num_queues":2,
                "queue_size":64,"id":"data","serial":"S1","image_type":"Qcow2",
                "pci_segment":0,"rate_limiter_config":{"ops":{"size":100,"refill_time":1000},
                "bandwidth":null},"queue_affinity":[{"queue_index":1,"host_cpus":[0]}],
                "backing_files":false,"sparse":true,"lock_granularity":"ByteRange"}"#,
        );
        assert!(d.options.readonly && d.options.direct);
        assert_eq!((d.num_queues, d.queue_size), (2, 64));
        assert_eq!(
            (d.id.as_deref(), d.serial.as_deref()),
            (Some("data"), Some("S1"))
        );
        assert_eq!(d.options.image_type, ImageType::Format("qcow2"));
        assert_eq!(d.rate_limit.ops.unwrap().refill_time_ms, 1000);
        assert_eq!(d.queue_affinity, vec![None, Some(vec![0])]);
        assert!(!d.backing_files);
        assert!(local(r#"{"path":"/a"}"#).backing_files);
    }

    #[test]
    fn disable_flags_pick_the_engine() {
        let engine = |s: &str| local(s).options.engine;
        assert_eq!(engine(r#"{"path":"a"}"#), EngineKind::Auto);
        assert_eq!(
            engine(r#"{"path":"a","disable_io_uring":true}"#),
            EngineKind::Threads
        );
        assert_eq!(
            engine(r#"{"path":"a","disable_io_uring":true,"disable_aio":true}"#),
            EngineKind::Threads
        );
        assert_eq!(
            engine(r#"{"path":"a","disable_aio":true}"#),
            EngineKind::Auto,
            "without O_DIRECT auto never picks AIO"
        );
        assert_ne!(
            engine(r#"{"path":"a","disable_aio":true,"direct":true}"#),
            EngineKind::Aio
        );
        assert_eq!(
            engine(r#"{"path":"a","disable_aio":true,"engine":"sync"}"#),
            EngineKind::Sync
        );
        for (s, words) in [
            (
                r#"{"path":"a","disable_io_uring":true,"engine":"io_uring"}"#,
                ["engine=io_uring", "disable_io_uring"],
            ),
            (
                r#"{"path":"a","disable_aio":true,"engine":"aio","direct":true}"#,
                ["engine=aio", "disable_aio"],
            ),
        ] {
            let e = json(s).unwrap_err().to_string();
            assert!(words.iter().all(|w| e.contains(w)), "{s}: {e}");
        }
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        for (s, field) in [
            (r#"{"path":"a","iommu":true}"#, "iommu"),
            (r#"{"path":"a","pci_segment":1}"#, "pci_segment"),
            (r#"{"path":"a","pci_device_id":3}"#, "pci_device_id"),
            (r#"{"path":"a","rate_limit_group":"g"}"#, "rate_limit_group"),
            (r#"{"path":"a","sparse":false}"#, "sparse"),
            (
                r#"{"path":"a","lock_granularity":"Full"}"#,
                "lock_granularity",
            ),
            (r#"{"path":"a","image_type":"Vhdx"}"#, "image_type"),
            (r#"{"path":"a","num_queues":0}"#, "num_queues"),
            (r#"{"path":"a","queue_size":100}"#, "queue_size"),
            (r#"{"path":"a","id":"bad id"}"#, "id"),
            (r#"{"path":"a","cache":"none","direct":false}"#, "direct"),
            (r#"{"path":"a","engine":"native"}"#, "engine"),
            (r#"{"path":"a","poll_us":5000}"#, "poll_us"),
            (r#"{"path":"a","reconnect_delay":5}"#, "reconnect_delay"),
            (r#"{"num_queues":1}"#, "path"),
            (
                r#"{"path":"a","rate_limiter_config":{"ops":{"size":0,"refill_time":1}}}"#,
                "ops_size",
            ),
            (
                r#"{"path":"a","queue_affinity":[{"queue_index":1,"host_cpus":[0]}]}"#,
                "queue_affinity",
            ),
            (r#"{"path":"a","vhost_socket":"/s"}"#, "socket"),
            (r#"{"vhost_user":true}"#, "socket"),
            (
                r#"{"vhost_user":true,"vhost_socket":"/s","path":"a"}"#,
                "path",
            ),
        ] {
            let e = json(s).unwrap_err().to_string();
            assert!(e.contains(field), "{s}: {e}");
        }
    }

    #[test]
    fn vhost_user_disks() {
        match json(r#"{"vhost_user":true,"vhost_socket":"/s","num_queues":2,"id":"v"}"#).unwrap() {
            ResolvedDisk::VhostUser(v) => {
                assert_eq!(v.socket, std::path::PathBuf::from("/s"));
                assert_eq!((v.num_queues, v.id.as_deref()), (2, Some("v")));
            }
            other => panic!("{other:?}"),
        }
    }
}
