//! The JSON bodies of the API, with Cloud Hypervisor's field names.
//!
//! Requests are parsed strictly (serde, unknown fields refused, types
//! checked). A `DiskConfig` body for `vm.add-disk` becomes the `--disk`
//! string it stands for and goes through the command line's own parser,
//! so a hot-added disk is checked exactly as a boot disk is
//! ([`DiskConfigBody::to_disk_arg`]). Answers that describe disks are
//! built from our [`DiskConfig`] ([`disk_config_json`]).

use block::ImageType;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::config::{DiskConfig, VhostUserDiskConfig};

/// `vm.resize-disk`; `shrink` (ours) must be true for a size below the
/// current one, as `ch-img resize --shrink`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeDiskBody {
    pub id: String,
    pub desired_size: u64,
    #[serde(default)]
    pub shrink: bool,
}

/// `vm.remove-device`, `vm.disk-info`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdBody {
    pub id: String,
}

/// `vm.snapshot-disk` (ours).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotDiskBody {
    pub id: String,
    pub name: String,
}

/// `vmm.ping`'s answer.
#[derive(Debug, Serialize)]
pub struct VmmPingResponse {
    pub build_version: String,
    pub version: String,
    pub pid: u32,
    pub features: Vec<String>,
}

/// `vm.add-disk`'s answer.
#[derive(Debug, Serialize)]
pub struct PciDeviceInfo {
    pub id: String,
    pub bdf: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketBody {
    pub size: u64,
    #[serde(default)]
    pub one_time_burst: u64,
    pub refill_time: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterBody {
    pub bandwidth: Option<TokenBucketBody>,
    pub ops: Option<TokenBucketBody>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueAffinityBody {
    pub queue_index: u64,
    pub host_cpus: Vec<u64>,
}

/// Cloud Hypervisor's `DiskConfig`, plus our `cache`, `engine` and
/// `poll_us` keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfigBody {
    pub path: Option<String>,
    pub readonly: Option<bool>,
    pub direct: Option<bool>,
    pub iommu: Option<bool>,
    pub num_queues: Option<u64>,
    pub queue_size: Option<u64>,
    pub vhost_user: Option<bool>,
    pub vhost_socket: Option<String>,
    pub rate_limiter_config: Option<RateLimiterBody>,
    pub pci_segment: Option<u16>,
    pub pci_device_id: Option<u8>,
    pub id: Option<String>,
    pub serial: Option<String>,
    pub rate_limit_group: Option<String>,
    pub queue_affinity: Option<Vec<QueueAffinityBody>>,
    pub backing_files: Option<bool>,
    pub sparse: Option<bool>,
    pub image_type: Option<String>,
    pub lock_granularity: Option<String>,
    pub cache: Option<String>,
    pub engine: Option<String>,
    pub poll_us: Option<u64>,
}

/// A string value that can stand in a `key=value,...` list.
fn plain(key: &str, v: &str) -> Result<String, String> {
    if v.contains([',', '[', ']']) {
        return Err(format!(
            "'{key}' cannot contain ',', '[' or ']' (as on the command line)"
        ));
    }
    Ok(v.to_string())
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

impl DiskConfigBody {
    /// The `--disk` option string this body stands for; an error names
    /// what this VMM does not support.
    pub fn to_disk_arg(&self) -> Result<String, String> {
        if self.iommu == Some(true) {
            return Err("iommu=true is not supported (there is no virtual IOMMU)".into());
        }
        if self.pci_segment.is_some_and(|s| s != 0) {
            return Err("only PCI segment 0 exists".into());
        }
        if self.pci_device_id.is_some() {
            return Err("pci_device_id is not supported (a disk takes the first free slot)".into());
        }
        if self.rate_limit_group.is_some() {
            return Err("rate_limit_group is not supported (use rate_limiter_config)".into());
        }
        if self.vhost_user == Some(true) || self.vhost_socket.is_some() {
            return Err("hot-adding a vhost-user disk is not supported".into());
        }
        if self.sparse == Some(false) {
            return Err("sparse=false is not supported (images are used as allocated)".into());
        }
        if let Some(g) = &self.lock_granularity {
            if g != "ByteRange" && g != "Full" {
                return Err(format!(
                    "lock_granularity '{g}': expected ByteRange or Full"
                ));
            }
        }
        let mut parts = Vec::new();
        if let Some(p) = &self.path {
            parts.push(format!("path={}", plain("path", p)?));
        }
        for (key, v) in [("readonly", self.readonly), ("direct", self.direct)] {
            if let Some(v) = v {
                parts.push(format!("{key}={}", on_off(v)));
            }
        }
        for (key, v) in [
            ("num_queues", self.num_queues),
            ("queue_size", self.queue_size),
            ("poll_us", self.poll_us),
        ] {
            if let Some(v) = v {
                parts.push(format!("{key}={v}"));
            }
        }
        for (key, v) in [
            ("id", &self.id),
            ("serial", &self.serial),
            ("cache", &self.cache),
            ("engine", &self.engine),
        ] {
            if let Some(v) = v {
                parts.push(format!("{key}={}", plain(key, v)?));
            }
        }
        if let Some(t) = &self.image_type {
            let t = match t.as_str() {
                "Raw" | "raw" => "raw",
                "Qcow2" | "qcow2" => "qcow2",
                "Unknown" | "auto" => "auto",
                other => {
                    return Err(format!(
                        "image_type '{other}' is not supported (Raw, Qcow2 or Unknown)"
                    ))
                }
            };
            parts.push(format!("image_type={t}"));
        }
        if let Some(r) = &self.rate_limiter_config {
            for (prefix, bucket) in [("bw", &r.bandwidth), ("ops", &r.ops)] {
                if let Some(b) = bucket {
                    parts.push(format!("{prefix}_size={}", b.size));
                    parts.push(format!("{prefix}_one_time_burst={}", b.one_time_burst));
                    parts.push(format!("{prefix}_refill_time={}", b.refill_time));
                }
            }
        }
        if let Some(a) = &self.queue_affinity {
            let items: Vec<String> = a
                .iter()
                .map(|q| {
                    let cpus: Vec<String> = q.host_cpus.iter().map(u64::to_string).collect();
                    format!("{}@[{}]", q.queue_index, cpus.join(","))
                })
                .collect();
            parts.push(format!("queue_affinity=[{}]", items.join(",")));
        }
        Ok(parts.join(","))
    }
}

fn image_type_name(t: ImageType) -> &'static str {
    match t {
        ImageType::Auto => "Unknown",
        ImageType::Raw => "Raw",
        ImageType::Qcow2 => "Qcow2",
    }
}

/// An in-VMM disk as `vm.info` shows it (Cloud Hypervisor's names, our
/// extra keys after them).
pub fn disk_config_json(c: &DiskConfig) -> Value {
    let o = &c.options;
    let mut m = Map::new();
    m.insert("path".into(), json!(o.path.display().to_string()));
    m.insert("readonly".into(), json!(o.readonly));
    m.insert("direct".into(), json!(o.direct));
    m.insert("iommu".into(), json!(false));
    m.insert("num_queues".into(), json!(c.num_queues));
    m.insert("queue_size".into(), json!(c.queue_size));
    m.insert("vhost_user".into(), json!(false));
    if let Some(id) = &c.id {
        m.insert("id".into(), json!(id));
    }
    if let Some(s) = &c.serial {
        m.insert("serial".into(), json!(s));
    }
    let bucket = |b: &virtio_devices::block::rate_limit::TokenBucketConfig| json!({"size": b.size, "one_time_burst": b.one_time_burst, "refill_time": b.refill_time_ms});
    if c.rate_limit.is_enabled() {
        let mut r = Map::new();
        if let Some(b) = &c.rate_limit.bandwidth {
            r.insert("bandwidth".into(), bucket(b));
        }
        if let Some(b) = &c.rate_limit.ops {
            r.insert("ops".into(), bucket(b));
        }
        m.insert("rate_limiter_config".into(), Value::Object(r));
    }
    let affinity: Vec<Value> = c
        .queue_affinity
        .iter()
        .enumerate()
        .filter_map(|(q, cpus)| {
            cpus.as_ref()
                .map(|cpus| json!({"queue_index": q, "host_cpus": cpus}))
        })
        .collect();
    if !affinity.is_empty() {
        m.insert("queue_affinity".into(), Value::Array(affinity));
    }
    m.insert("pci_segment".into(), json!(0));
    m.insert("image_type".into(), json!(image_type_name(o.image_type)));
    m.insert("cache".into(), json!(o.cache.as_str()));
    m.insert("engine".into(), json!(o.engine.as_str()));
    m.insert("poll_us".into(), json!(c.poll_us));
    Value::Object(m)
}

/// A vhost-user disk as `vm.info` shows it.
pub fn vhost_user_disk_json(c: &VhostUserDiskConfig) -> Value {
    json!({
        "vhost_user": true,
        "vhost_socket": c.socket.display().to_string(),
        "num_queues": c.num_queues,
        "queue_size": c.queue_size,
        "id": c.id,
        "pci_segment": 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::disk::parse_disk;

    fn body(s: &str) -> Result<DiskConfigBody, serde_json::Error> {
        serde_json::from_str(s)
    }

    #[test]
    fn a_cloud_hypervisor_disk_config_becomes_a_disk_option() {
        let b = body(
            r#"{"path":"/i.qcow2","readonly":false,"num_queues":2,"queue_size":64,
                "id":"data","image_type":"Qcow2","iommu":false,"pci_segment":0,
                "rate_limiter_config":{"ops":{"size":100,"refill_time":1000}},
                "queue_affinity":[{"queue_index":1,"host_cpus":[0]}],
                "backing_files":true,"sparse":true,"engine":"sync"}"#,
        )
        .unwrap();
        let arg = b.to_disk_arg().unwrap();
        let d = parse_disk(&arg).unwrap();
        assert_eq!(d.options.path.to_str(), Some("/i.qcow2"));
        assert_eq!((d.num_queues, d.queue_size), (2, 64));
        assert_eq!(d.id.as_deref(), Some("data"));
        assert_eq!(d.options.image_type, ImageType::Qcow2);
        assert_eq!(d.rate_limit.ops.unwrap().size, 100);
        assert_eq!(d.queue_affinity, vec![None, Some(vec![0])]);
        // And back.
        let v = disk_config_json(&d);
        assert_eq!(v["image_type"], "Qcow2");
        assert_eq!(v["rate_limiter_config"]["ops"]["refill_time"], 1000);
        assert_eq!(v["queue_affinity"][0]["queue_index"], 1);
    }

    #[test]
    fn what_we_cannot_do_is_refused_by_name() {
        assert!(body(r#"{"path":"a","bogus":1}"#)
            .unwrap_err()
            .to_string()
            .contains("bogus"));
        assert!(body(r#"{"path":7}"#).is_err());
        assert!(body(r#"{"num_queues":-1}"#).is_err());
        for (json, word) in [
            (r#"{"path":"a","iommu":true}"#, "iommu"),
            (r#"{"path":"a","pci_segment":1}"#, "segment"),
            (r#"{"path":"a","vhost_user":true}"#, "vhost-user"),
            (r#"{"path":"a","rate_limit_group":"g"}"#, "rate_limit_group"),
            (r#"{"path":"a,b"}"#, "path"),
            (r#"{"path":"a","image_type":"Vhdx"}"#, "Vhdx"),
            (r#"{"path":"a","sparse":false}"#, "sparse"),
        ] {
            let e = body(json).unwrap().to_disk_arg().unwrap_err();
            assert!(e.contains(word), "{json}: {e}");
        }
        // What the command line refuses, the API refuses the same way.
        for (json, word) in [
            (r#"{"num_queues":1}"#, "path"),
            (r#"{"path":"a","num_queues":0}"#, "num_queues"),
            (r#"{"path":"a","queue_size":100}"#, "queue_size"),
            (r#"{"path":"a","cache":"none","direct":false}"#, "direct"),
            (r#"{"path":"a","id":"bad id"}"#, "id"),
        ] {
            let arg = body(json).unwrap().to_disk_arg().unwrap();
            let e = parse_disk(&arg).unwrap_err().to_string();
            assert!(e.contains(word), "{json}: {e}");
        }
    }
}
