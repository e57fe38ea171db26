//! `--disk vhost_user=on,socket=PATH[,num_queues=N][,queue_size=N][,id=NAME]`:
//! a virtio-blk disk served by a vhost-user backend (Cloud Hypervisor's
//! spelling; `vhost_user=true` works too).
//!
//! Enters as the `--disk` string; [`is_vhost_user`] tells the argument
//! walker which parser to use, and [`parse_vhost_user_disk`] leaves a
//! [`VhostUserDiskConfig`]. The image and its I/O belong to the backend,
//! so the keys that describe them are refused here with a message saying
//! so ([`BACKEND_KEYS`]). That guest RAM must be shared is checked once
//! every option is known (`--memory shared=on`).

use std::path::PathBuf;

use block::options::kv::{parse_on_off, KvError, KvList};

use super::disk::{parse_disk_id, parse_queue_shape};
use super::ConfigError;

/// Keys that describe the image or its I/O: the backend's business.
pub const BACKEND_KEYS: &[&str] = &[
    "path",
    "readonly",
    "direct",
    "cache",
    "image_type",
    "engine",
    "serial",
    "bw_size",
    "bw_one_time_burst",
    "bw_refill_time",
    "ops_size",
    "ops_one_time_burst",
    "ops_refill_time",
    "queue_affinity",
    "poll_us",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VhostUserDiskConfig {
    pub socket: PathBuf,
    pub num_queues: u16,
    pub queue_size: u16,
    pub id: Option<String>,
}

/// Whether a `--disk` value asks for a vhost-user disk.
pub fn is_vhost_user(s: &str) -> Result<bool, ConfigError> {
    let mut kv = KvList::parse("--disk", s)?;
    Ok(kv.take_parsed("vhost_user", parse_on_off)?.unwrap_or(false))
}

pub fn parse_vhost_user_disk(s: &str) -> Result<VhostUserDiskConfig, ConfigError> {
    let mut kv = KvList::parse("--disk", s)?;
    kv.take("vhost_user")?;
    for &key in BACKEND_KEYS {
        if kv.take(key)?.is_some() {
            return Err(ConfigError::VhostUserBackendKey(key));
        }
    }
    let socket = kv
        .take_parsed("socket", |v| {
            if v.is_empty() {
                Err("empty path".to_string())
            } else {
                Ok(PathBuf::from(v))
            }
        })?
        .ok_or(KvError::MissingKey {
            option: "--disk",
            key: "socket",
        })?;
    let (num_queues, queue_size) = parse_queue_shape(&mut kv)?;
    let id = parse_disk_id(&mut kv)?;
    kv.finish()?;
    Ok(VhostUserDiskConfig {
        socket,
        num_queues,
        queue_size,
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_defaults() {
        assert!(is_vhost_user("vhost_user=on,socket=/s").unwrap());
        assert!(is_vhost_user("vhost_user=true,socket=/s").unwrap());
        assert!(!is_vhost_user("path=x").unwrap());
        assert!(!is_vhost_user("path=x,vhost_user=off").unwrap());
        let d = parse_vhost_user_disk("vhost_user=on,socket=/s,num_queues=2,queue_size=256,id=d")
            .unwrap();
        assert_eq!(
            d,
            VhostUserDiskConfig {
                socket: "/s".into(),
                num_queues: 2,
                queue_size: 256,
                id: Some("d".into()),
            }
        );
        let d = parse_vhost_user_disk("vhost_user=on,socket=/s").unwrap();
        assert_eq!((d.num_queues, d.queue_size), (1, 128));
    }

    #[test]
    fn refuses_backend_keys_and_missing_socket() {
        for key in BACKEND_KEYS {
            let e = parse_vhost_user_disk(&format!("vhost_user=on,socket=/s,{key}=x"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("backend"), "{key}: {e}");
        }
        let e = parse_vhost_user_disk("vhost_user=on")
            .unwrap_err()
            .to_string();
        assert!(e.contains("socket"), "{e}");
        let e = parse_vhost_user_disk("vhost_user=on,socket=/s,num_queues=0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_queues"), "{e}");
        let e = parse_vhost_user_disk("vhost_user=on,socket=/s,bogus=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        assert!(is_vhost_user("vhost_user=maybe").is_err());
    }
}
