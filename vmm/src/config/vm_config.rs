//! Cloud Hypervisor's `VmConfig`: the one description of a VM that the
//! command line and the API share. `vm.create`'s JSON body is
//! deserialized into it by serde; `--kernel`, `--cpus`, `--memory`,
//! `--disk`, `--serial`, ... are parsed into it ([`super::args`]);
//! `vm.info` shows it back. What it means here, and whether this VMM can
//! do it, is decided once, by [`super::boot_config`], for both ways in
//! (at `vm.boot`, as upstream validates).
//!
//! The field names are upstream's (v54), each with its default, so the
//! configs its clients send deserialize: `cpus`, `memory`, `payload`,
//! `disks` (the [`DiskConfig`] `vm.add-disk` takes too), `serial`,
//! `console`. Upstream's parts this VMM has no device for (`net`, `fs`,
//! `pmem`, `vsock`, ...) are kept as raw JSON so that
//! [`VmConfig::refuse_unimplemented`] can name the one that was given;
//! an empty one (absent, `null`, `[]`, `false`, or upstream's own
//! defaults, which its exported configs always carry) is fine.
//! `cpus.model` and `cpus.hide` are ours (the CPU model, docs/vmm.md).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::disk_config::DiskConfig;

fn is_false(b: &bool) -> bool {
    !*b
}

/// `cpus`: how many vCPUs, and (ours) the CPU model they show.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CpusConfig {
    pub boot_vcpus: u32,
    /// `None`: as `boot_vcpus` (there is no CPU hotplug).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_vcpus: Option<u32>,
    /// Ours: `host` or `x86-64-v1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Ours: CPU features to hide, by Linux's `/proc/cpuinfo` name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hide: Option<Vec<String>>,
    // Upstream's, taken when they ask for nothing this VMM lacks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<Value>,
    #[serde(skip_serializing_if = "is_false")]
    pub kvm_hyperv: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_phys_bits: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nested: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_scheduling: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

impl Default for CpusConfig {
    fn default() -> Self {
        CpusConfig {
            boot_vcpus: 1,
            max_vcpus: None,
            model: None,
            hide: None,
            topology: None,
            kvm_hyperv: false,
            max_phys_bits: None,
            affinity: None,
            features: None,
            nested: None,
            core_scheduling: None,
            profile: None,
        }
    }
}

/// Guest RAM when `memory` (or its `size`) is not given.
pub const DEFAULT_MEMORY: u64 = 512 << 20;

/// `memory`: guest RAM.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryConfig {
    pub size: u64,
    pub shared: bool,
    // Upstream's, taken at their defaults.
    #[serde(skip_serializing_if = "is_false")]
    pub mergeable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotplug_method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotplug_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotplugged_size: Option<u64>,
    #[serde(skip_serializing_if = "is_false")]
    pub hugepages: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugepage_size: Option<u64>,
    #[serde(skip_serializing_if = "is_false")]
    pub prefault: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub reserve: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zones: Option<Value>,
    /// Transparent huge pages: a hint this VMM leaves to the host's
    /// default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thp: Option<bool>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            size: DEFAULT_MEMORY,
            shared: false,
            mergeable: false,
            hotplug_method: None,
            hotplug_size: None,
            hotplugged_size: None,
            hugepages: false,
            hugepage_size: None,
            prefault: false,
            reserve: false,
            zones: None,
            thp: None,
        }
    }
}

/// `payload`: what boots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PayloadConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initramfs: Option<String>,
    // Upstream's other payloads (refused when given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub igvm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_data: Option<String>,
}

/// Where a console's output goes (upstream's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsoleMode {
    Off,
    Pty,
    Tty,
    File,
    Socket,
    Null,
}

/// `serial` and `console`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsoleConfig {
    pub mode: ConsoleMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub iommu: bool,
}

impl ConsoleConfig {
    pub fn mode(mode: ConsoleMode) -> Self {
        ConsoleConfig {
            mode,
            file: None,
            socket: None,
            iommu: false,
        }
    }

    /// Output to `path`.
    pub fn file(path: &str) -> Self {
        ConsoleConfig {
            file: Some(path.to_string()),
            ..Self::mode(ConsoleMode::File)
        }
    }
}

/// Upstream's default serial port: none.
fn default_serial() -> ConsoleConfig {
    ConsoleConfig::mode(ConsoleMode::Null)
}

/// A VM as asked for (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VmConfig {
    pub cpus: CpusConfig,
    pub memory: MemoryConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<PayloadConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disks: Option<Vec<DiskConfig>>,
    pub serial: ConsoleConfig,
    /// `None`: no virtio console (upstream's default, a console on the
    /// VMM's terminal, does not exist here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console: Option<ConsoleConfig>,
    pub iommu: bool,
    pub pvpanic: bool,
    pub watchdog: bool,
    pub landlock_enable: bool,
    /// Upstream's parts this VMM has no device for (module doc).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub net: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pmem: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vsock: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rng: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balloon: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_devices: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vdpa: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generic_vhost_user: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpm: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtc: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_segments: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit_groups: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub landlock_rules: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug_console: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ivshmem: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvmemcontrol: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gdb: Option<Value>,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            cpus: CpusConfig::default(),
            memory: MemoryConfig::default(),
            payload: None,
            disks: None,
            serial: default_serial(),
            console: None,
            iommu: false,
            pvpanic: false,
            watchdog: false,
            landlock_enable: false,
            net: None,
            fs: None,
            pmem: None,
            vsock: None,
            rng: None,
            balloon: None,
            devices: None,
            user_devices: None,
            vdpa: None,
            generic_vhost_user: None,
            numa: None,
            tpm: None,
            rtc: None,
            platform: None,
            pci_segments: None,
            rate_limit_groups: None,
            landlock_rules: None,
            debug_console: None,
            ivshmem: None,
            pvmemcontrol: None,
            gdb: None,
        }
    }
}

/// A part of a config this VMM cannot honour, named by its JSON path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{field}' is not supported here: {why}")]
pub struct Unimplemented {
    pub field: String,
    pub why: &'static str,
}

/// Whether `v` asks for nothing: absent, `null`, `false`, `0`, `""`,
/// `[]`, or an object whose every value asks for nothing.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_u64() == Some(0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.values().all(is_empty),
    }
}

/// Upstream's default entropy device, which every config it exports
/// carries (`{"src": "/dev/urandom"}`, maybe with `iommu`/`pci_segment`
/// at their defaults).
fn is_default_rng(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().all(|(k, v)| match k.as_str() {
            "src" => v == "/dev/urandom",
            _ => is_empty(v),
        }),
        other => is_empty(other),
    }
}

/// Upstream's default debug console: off.
fn is_default_debug_console(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().all(|(k, v)| match k.as_str() {
            "mode" => v == "Off",
            // Upstream's default port, 0xe9.
            "iobase" => v.as_u64() == Some(0xe9) || is_empty(v),
            _ => is_empty(v),
        }),
        other => is_empty(other),
    }
}

impl VmConfig {
    /// The first part of the config that asks for a device or feature
    /// this VMM does not have: what `vm.create` refuses with 400 (the
    /// values of the parts it has are checked at boot).
    pub fn refuse_unimplemented(&self) -> Result<(), Unimplemented> {
        let parts: [(&str, &Option<Value>, &'static str); 21] = [
            ("net", &self.net, "there is no network device"),
            ("fs", &self.fs, "there is no virtio-fs device"),
            ("pmem", &self.pmem, "there is no virtio-pmem device"),
            ("vsock", &self.vsock, "there is no virtio-vsock device"),
            (
                "balloon",
                &self.balloon,
                "there is no virtio-balloon device",
            ),
            (
                "devices",
                &self.devices,
                "there is no VFIO device assignment",
            ),
            (
                "user_devices",
                &self.user_devices,
                "there are no vfio-user devices",
            ),
            ("vdpa", &self.vdpa, "there are no vDPA devices"),
            (
                "generic_vhost_user",
                &self.generic_vhost_user,
                "only vhost-user block disks (disks[].vhost_user)",
            ),
            ("numa", &self.numa, "there is no NUMA topology"),
            ("tpm", &self.tpm, "there is no TPM device"),
            ("rtc", &self.rtc, "there is no virtio-rtc device"),
            ("platform", &self.platform, "there are no platform options"),
            (
                "pci_segments",
                &self.pci_segments,
                "there is one PCI segment",
            ),
            (
                "rate_limit_groups",
                &self.rate_limit_groups,
                "throttling is per disk (disks[].rate_limiter_config)",
            ),
            (
                "landlock_rules",
                &self.landlock_rules,
                "there is no Landlock sandbox",
            ),
            ("ivshmem", &self.ivshmem, "there is no ivshmem device"),
            (
                "pvmemcontrol",
                &self.pvmemcontrol,
                "there is no pvmemcontrol device",
            ),
            ("gdb", &self.gdb, "there is no GDB stub"),
            (
                "cpus.topology",
                &self.cpus.topology,
                "vCPUs have no topology here",
            ),
            (
                "cpus.affinity",
                &self.cpus.affinity,
                "vCPU threads are not pinned here",
            ),
        ];
        let refuse = |field: &str, why| {
            Err(Unimplemented {
                field: field.to_string(),
                why,
            })
        };
        for (field, value, why) in parts {
            if value.as_ref().is_some_and(|v| !is_empty(v)) {
                return refuse(field, why);
            }
        }
        if self.rng.as_ref().is_some_and(|v| !is_default_rng(v)) {
            return refuse("rng", "there is no virtio-rng device");
        }
        if self
            .debug_console
            .as_ref()
            .is_some_and(|v| !is_default_debug_console(v))
        {
            return refuse("debug_console", "there is no debug console (port 0xe9)");
        }
        for (field, on, why) in [
            ("iommu", self.iommu, "there is no virtual IOMMU"),
            ("pvpanic", self.pvpanic, "there is no pvpanic device"),
            (
                "watchdog",
                self.watchdog,
                "there is no virtio-watchdog device",
            ),
            (
                "landlock_enable",
                self.landlock_enable,
                "there is no Landlock sandbox",
            ),
            (
                "cpus.kvm_hyperv",
                self.cpus.kvm_hyperv,
                "there is no Hyper-V emulation",
            ),
            (
                "memory.mergeable",
                self.memory.mergeable,
                "guest RAM is not merged (KSM)",
            ),
            (
                "memory.hugepages",
                self.memory.hugepages,
                "guest RAM is in normal pages",
            ),
            (
                "memory.prefault",
                self.memory.prefault,
                "guest RAM is not prefaulted",
            ),
            (
                "memory.reserve",
                self.memory.reserve,
                "guest RAM is not reserved up front",
            ),
        ] {
            if on {
                return refuse(field, why);
            }
        }
        let memory_parts = [
            (
                "memory.hotplug_size",
                self.memory.hotplug_size.is_some_and(|n| n > 0),
            ),
            (
                "memory.hotplugged_size",
                self.memory.hotplugged_size.is_some_and(|n| n > 0),
            ),
            ("memory.hugepage_size", self.memory.hugepage_size.is_some()),
            (
                "memory.zones",
                self.memory.zones.as_ref().is_some_and(|v| !is_empty(v)),
            ),
        ];
        if let Some((field, _)) = memory_parts.iter().find(|(_, set)| *set) {
            return refuse(
                field,
                "guest RAM is one region of --memory size (no hotplug, zones or huge pages)",
            );
        }
        if self.cpus.features.as_ref().is_some_and(|v| !is_empty(v)) {
            return refuse(
                "cpus.features",
                "there are no optional CPU features (AMX) here",
            );
        }
        if self.cpus.profile.as_deref().is_some_and(|p| p != "Host") {
            return refuse(
                "cpus.profile",
                "the CPU model is cpus.model (host or x86-64-v1)",
            );
        }
        if let Some(p) = &self.payload {
            for (field, set, why) in [
                (
                    "payload.firmware",
                    p.firmware.is_some(),
                    "only a kernel boots (PVH ELF or bzImage)",
                ),
                (
                    "payload.igvm",
                    p.igvm.is_some(),
                    "only a kernel boots (PVH ELF or bzImage)",
                ),
                (
                    "payload.host_data",
                    p.host_data.is_some(),
                    "there are no confidential VMs",
                ),
            ] {
                if set {
                    return refuse(field, why);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
