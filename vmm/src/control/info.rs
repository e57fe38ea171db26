//! `vmm.ping` and `vm.info`, shaped as Cloud Hypervisor shapes them.
//!
//! `vm.info`'s `config` is the VM's `VmConfig` (upstream's keys, as
//! `vm.create` took it or the command line made it), its disks as the
//! VM has them (hot-added ones included, each with its id and the probed
//! `image_type`); its `device_tree` has upstream's layout: each
//! virtio-pci disk is a `<id>` node whose parent is `_virtio-pci-<id>`,
//! the function node with the BAR and `pci_bdf`.

use serde_json::{json, Map, Value};
use virtio_devices::transport::virtio_pci::BAR_SIZE;

use super::Control;
use crate::api::types::{DeviceNode, VmmPingResponse};
use crate::api::ApiResponse;
use crate::config::disk_config::ImageTypeName;
use crate::config::DiskConfig;
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
        self.vm
            .iter()
            .flat_map(|v| v.machine.devices.disks.iter())
            .map(|d| match &d.backend {
                DiskBackend::Local { config, .. } => DiskConfig::from_local(config, probed_type(d)),
                DiskBackend::VhostUser { config } => DiskConfig::from_vhost_user(config),
            })
            .collect()
    }

    pub(crate) fn info(&mut self) -> ApiResponse {
        let Some(config) = &self.config else {
            return ApiResponse::error(404, &["vm.info", "the VM is not created"]);
        };
        let mut config = config.clone();
        if self.vm.is_some() {
            let disks = self.disk_configs();
            config.disks = (!disks.is_empty()).then_some(disks);
        }
        let boot_vcpus = config.cpus.boot_vcpus;
        config.cpus.max_vcpus.get_or_insert(boot_vcpus);
        let memory = config.memory.size;
        let mut config = match serde_json::to_value(&config) {
            Ok(v) => v,
            Err(e) => {
                return ApiResponse::error(500, &["cannot encode the config", &e.to_string()])
            }
        };
        // There is no virtio console: say so, as upstream shows it off.
        if config.get("console").is_none() {
            config["console"] = json!({"mode": "Off"});
        }
        let mut info = json!({
            "config": config,
            "state": self.state().name(),
            "memory_actual_size": memory,
        });
        // Upstream shows the device tree of a booted VM only.
        if let Some(vm) = &self.vm {
            let mut tree = Map::new();
            for d in vm.machine.devices.disks.iter() {
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
            info["device_tree"] = Value::Object(tree);
        }
        ApiResponse::json(&info)
    }
}
