//! `--disk vhost_user=on,socket=PATH[,num_queues=N][,queue_size=N][,id=NAME]`
//! (or a `DiskConfig` with `vhost_user: true`): a virtio-blk disk served
//! by a vhost-user backend, Cloud Hypervisor's spelling.
//!
//! Parsed like any disk ([`super::disk::parse_disk`]); what it resolves
//! to is a [`VhostUserDiskConfig`] ([`super::disk_resolve`]). The image
//! and its I/O belong to the backend, so the fields that describe them
//! are refused there with a message saying so. That guest RAM must be
//! shared is checked once every option is known (`--memory shared=on`).

use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VhostUserDiskConfig {
    pub socket: PathBuf,
    pub num_queues: u16,
    pub queue_size: u16,
    pub id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::super::disk::parse_disk;
    use super::super::disk_resolve::ResolvedDisk;
    use super::*;

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
