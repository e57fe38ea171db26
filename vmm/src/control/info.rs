//! `vmm.ping` and `vm.info`, shaped as Cloud Hypervisor shapes them.
//!
//! `vm.info`'s `config` uses upstream's `VmConfig` keys for what this
//! VMM has (cpus, memory, payload, disks as `DiskConfig`s with the
//! probed `image_type`, serial, console); its `device_tree` has
//! upstream's layout: each virtio-pci disk is a `<id>` node whose parent
//! is `_virtio-pci-<id>`, the function node with the BAR and `pci_bdf`.

use serde_json::{json, Map, Value};
use virtio_devices::transport::virtio_pci::BAR_SIZE;

use super::{Control, VmState};
use crate::api::types::{DeviceNode, VmmPingResponse};
use crate::api::ApiResponse;
use crate::config::disk_config::ImageTypeName;
use crate::config::{DiskConfig, SerialMode};
use crate::disk_registry::{AttachedDisk, DiskBackend};

/// The format an opened image was found to be.
fn probed_type(d: &AttachedDisk) -> ImageTypeName {
    match d.lock_device().map(|dev| dev.disk().format().info().format) {
        Some("qcow2") => ImageTypeName::Qcow2,
        Some("raw") => ImageTypeName::Raw,
        _ => ImageTypeName::Unknown,
    }
}

impl Control {
    pub(crate) fn ping(&mut self) -> ApiResponse {
        let version = env!("CARGO_PKG_VERSION");
        ApiResponse::json(&VmmPingResponse {
            build_version: format!("v{version}"),
            version: version.to_string(),
            pid: std::process::id(),
            features: vec!["io_uring".into(), "kvm".into()],
        })
    }

    /// The disks on the bus as `vm.info`'s `config` lists them.
    pub(super) fn disk_configs(&self) -> Vec<DiskConfig> {
        self.devices
            .disks
            .iter()
            .map(|d| match &d.backend {
                DiskBackend::Local { config, .. } => DiskConfig::from_local(config, probed_type(d)),
                DiskBackend::VhostUser { config } => DiskConfig::from_vhost_user(config),
            })
            .collect()
    }

    pub(crate) fn info(&mut self) -> ApiResponse {
        let c = &self.config;
        // After vm.shutdown the disks are off the bus; their configuration
        // is still the VM's.
        let mut disks = self.disk_configs();
        disks.extend(self.retired.iter().cloned());
        let mut tree = Map::new();
        for d in self.devices.disks.iter() {
            let nodes = DeviceNode::virtio_pci(
                &d.id,
                d.function.bdf(),
                u64::from(d.function.bar),
                u64::from(BAR_SIZE),
            );
            for node in nodes {
                let id = node.id.clone();
                match serde_json::to_value(node) {
                    Ok(v) => tree.insert(id, v),
                    Err(e) => {
                        return ApiResponse::error(
                            500,
                            &["cannot encode the device tree", &e.to_string()],
                        )
                    }
                };
            }
        }
        let serial = match &c.serial {
            SerialMode::Tty => json!({"mode": "Tty"}),
            SerialMode::Off => json!({"mode": "Off"}),
            SerialMode::File(p) => json!({"mode": "File", "file": p.display().to_string()}),
        };
        let mut payload = Map::new();
        payload.insert("kernel".into(), json!(c.kernel.display().to_string()));
        payload.insert("cmdline".into(), json!(c.cmdline));
        if let Some(i) = &c.initramfs {
            payload.insert("initramfs".into(), json!(i.display().to_string()));
        }
        let mut info = json!({
            "config": {
                "cpus": {"boot_vcpus": c.cpus, "max_vcpus": c.cpus},
                "memory": {"size": c.memory, "shared": c.shared_memory},
                "payload": payload,
                "disks": disks,
                "serial": serial,
                "console": {"mode": "Off"},
                "iommu": false,
                "pvpanic": false,
                "watchdog": false,
                "landlock_enable": false,
            },
            "state": self.state.name(),
            "memory_actual_size": c.memory,
        });
        // Upstream leaves the device tree out once the VM is shut down.
        if self.state != VmState::Shutdown {
            info["device_tree"] = Value::Object(tree);
        }
        ApiResponse::json(&info)
    }
}
