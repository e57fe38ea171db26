//! The JSON bodies of the API, with Cloud Hypervisor's field names.
//!
//! Requests are parsed by serde with their types checked; unknown fields
//! are ignored and logged ([`super::endpoint::parse_body`]), as Cloud
//! Hypervisor ignores them. A disk is the configuration's `DiskConfig`
//! (`crate::config::DiskConfig`), the type `--disk` parses into too.
//! Answers: `vmm.ping`'s, `vm.add-disk`'s, and the nodes of `vm.info`'s
//! `device_tree` in upstream's layout.

use serde::{Deserialize, Serialize};

/// `vm.resize-disk`; `shrink` (ours) must be true for a size below the
/// current one, as `ch-img resize --shrink`.
#[derive(Debug, Deserialize, Serialize)]
pub struct ResizeDiskBody {
    pub id: String,
    pub desired_size: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shrink: bool,
}

/// `vm.remove-device`, `vm.disk-info`.
#[derive(Debug, Deserialize, Serialize)]
pub struct IdBody {
    pub id: String,
}

/// `vm.snapshot-disk` (ours).
#[derive(Debug, Deserialize, Serialize)]
pub struct SnapshotDiskBody {
    pub id: String,
    pub name: String,
}

/// `vm.disk-snapshot-external` (ours): the disks to switch to a new
/// qcow2 overlay each, all at one instant.
#[derive(Debug, Deserialize, Serialize)]
pub struct SnapshotExternalBody {
    pub disks: Vec<DiskOverlay>,
}

/// One disk of [`SnapshotExternalBody`]: its id and the overlay to make.
#[derive(Debug, Deserialize, Serialize)]
pub struct DiskOverlay {
    pub id: String,
    pub overlay: String,
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

/// A BAR of a PCI function, as upstream's device tree lists it.
#[derive(Debug, Serialize)]
pub struct PciBar {
    pub index: u32,
    pub base: u64,
    pub size: u64,
    /// `Mmio32` or `Mmio64`.
    pub type_: &'static str,
    pub prefetchable: bool,
}

/// One resource of a device node.
#[derive(Debug, Serialize)]
pub enum Resource {
    PciBar(PciBar),
}

/// One node of `vm.info`'s `device_tree`. A virtio-pci disk is two:
/// `<id>` (the virtio device, its parent the transport) and
/// `_virtio-pci-<id>` (the PCI function: BARs, address, the device as
/// its child).
#[derive(Debug, Serialize)]
pub struct DeviceNode {
    pub id: String,
    pub resources: Vec<Resource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub children: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_bdf: Option<String>,
}

impl DeviceNode {
    /// The two nodes of virtio device `id` behind the PCI function at
    /// `bdf` with a 32-bit BAR 0 at `bar` of `bar_size` bytes.
    pub fn virtio_pci(id: &str, bdf: String, bar: u64, bar_size: u64) -> [DeviceNode; 2] {
        let transport = format!("_virtio-pci-{id}");
        [
            DeviceNode {
                id: id.to_string(),
                resources: Vec::new(),
                parent: Some(transport.clone()),
                children: Vec::new(),
                pci_bdf: None,
            },
            DeviceNode {
                id: transport,
                resources: vec![Resource::PciBar(PciBar {
                    index: 0,
                    base: bar,
                    size: bar_size,
                    type_: "Mmio32",
                    prefetchable: false,
                })],
                parent: None,
                children: vec![id.to_string()],
                pci_bdf: Some(bdf),
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_is_two_nodes_in_upstreams_layout() {
        let [dev, pci] =
            DeviceNode::virtio_pci("_disk0", "0000:00:02.0".into(), 0xe800_0000, 0x8_0000);
        let dev = serde_json::to_value(dev).unwrap();
        let pci = serde_json::to_value(pci).unwrap();
        assert_eq!(
            dev,
            serde_json::json!({"id": "_disk0", "resources": [],
                "parent": "_virtio-pci-_disk0", "children": []})
        );
        assert_eq!(
            pci,
            serde_json::json!({"id": "_virtio-pci-_disk0",
                "resources": [{"PciBar": {"index": 0, "base": 0xe800_0000u64,
                    "size": 0x8_0000, "type_": "Mmio32", "prefetchable": false}}],
                "children": ["_disk0"], "pci_bdf": "0000:00:02.0"})
        );
    }
}

/// `vm.disk-mirror` (ours): mirror a running disk to `target` (a local
/// path or an NBD URI). docs/api.md and docs/block-jobs.md say what each
/// field means; left out: qcow2 (a new target), full, background, no
/// rate limit, 64 KiB granules.
#[derive(Debug, Deserialize, Serialize)]
pub struct DiskMirrorBody {
    pub id: String,
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub existing: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Bytes per second (0 or none: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<u64>,
    /// Bytes a dirty bit stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granularity: Option<u64>,
}

/// `vm.disk-job-complete`, `vm.disk-job-cancel` (ours).
#[derive(Debug, Deserialize, Serialize)]
pub struct JobBody {
    pub job: String,
}

/// `vm.disk-stream` (ours): copy the backing chain of a running disk,
/// down to `base` (a file of the chain; none: all of it), into its
/// active image, then drop that part of the chain. docs/api.md.
#[derive(Debug, Deserialize, Serialize)]
pub struct DiskStreamBody {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Bytes per second (0 or none: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<u64>,
}

/// `vm.disk-commit` (ours): merge `top` (a file of the chain; none: the
/// active image) and the layers between it and `base` (a file below it;
/// none: the last one) into `base`. docs/api.md.
#[derive(Debug, Deserialize, Serialize)]
pub struct DiskCommitBody {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<String>,
    /// Bytes per second (0 or none: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed: Option<u64>,
    /// Bytes a dirty bit stands for (an active commit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granularity: Option<u64>,
}
