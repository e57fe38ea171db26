//! What a [`VmConfig`] means here: the one place its values are checked
//! and turned into a [`BootConfig`], what the VM is built from, for a
//! VM described on the command line and one made by `vm.create` alike.
//! A value this VMM cannot honour is refused by its JSON path
//! ([`VmConfigError`], [`super::vm_config_error`]), never ignored.
//!
//! Disks without an id get Cloud Hypervisor's default ones (`_disk0`,
//! `_disk1`, ... in PCI order: the in-VMM disks first, then the
//! vhost-user ones, skipping ids already taken), written back into the
//! config as upstream writes them back, so `vm.info` shows them.

use std::path::PathBuf;

use super::cpus::resolve_cpus;
use super::disk_resolve::ResolvedDisk;
use super::local_disk::LocalDiskConfig;
use super::memory::check_size;
use super::serial::SerialMode;
use super::vhost_user_disk::VhostUserDiskConfig;
use super::vm_config::{ConsoleMode, VmConfig};
use super::vm_config_error::VmConfigError;

/// Everything needed to boot, checked.
#[derive(Clone, Debug)]
pub struct BootConfig {
    pub kernel: PathBuf,
    pub initramfs: Option<PathBuf>,
    pub cmdline: String,
    pub cpus: u8,
    /// What CPUID shows the guest (`cpus.model`, `cpus.hide`).
    pub cpu_model: hypervisor::CpuModel,
    pub memory: u64,
    /// Guest RAM in a memfd mapped shared (`memory.shared`).
    pub shared_memory: bool,
    pub disks: Vec<LocalDiskConfig>,
    /// Disks a vhost-user backend serves.
    pub vhost_user_disks: Vec<VhostUserDiskConfig>,
    pub serial: SerialMode,
}

fn bad(field: &str, value: impl ToString, reason: impl Into<String>) -> VmConfigError {
    VmConfigError::BadValue {
        field: field.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

impl VmConfig {
    /// Gives every disk without an id the first free default one.
    pub fn assign_disk_ids(&mut self) {
        let Some(disks) = self.disks.as_mut() else {
            return;
        };
        let taken: Vec<String> = disks.iter().filter_map(|d| d.id.clone()).collect();
        let taken: Vec<&str> = taken.iter().map(String::as_str).collect();
        let mut next = 0;
        // In-VMM disks come first on the bus, then the vhost-user ones.
        for vhost_user in [false, true] {
            for d in disks.iter_mut().filter(|d| d.vhost_user == vhost_user) {
                if d.id.is_none() {
                    d.id = Some(super::disk_id::next_free_disk_id(&mut next, &taken));
                }
            }
        }
    }

    /// Checks every value (after giving disks their ids) and builds what
    /// the VM is made from.
    pub fn resolve(&mut self) -> Result<BootConfig, VmConfigError> {
        self.refuse_unimplemented()?;
        self.assign_disk_ids();
        let (cpus, cpu_model) = resolve_cpus(&self.cpus)
            .map_err(|e| bad(&format!("cpus.{}", e.field), e.value, e.reason))?;
        let memory =
            check_size(self.memory.size).map_err(|r| bad("memory.size", self.memory.size, r))?;
        let payload = self.payload.clone().unwrap_or_default();
        let kernel = match payload.kernel.as_deref() {
            Some(k) if !k.is_empty() => PathBuf::from(k),
            Some(k) => return Err(bad("payload.kernel", k, "empty path")),
            None => return Err(VmConfigError::Missing("payload.kernel")),
        };
        let initramfs = match payload.initramfs.as_deref() {
            Some("") => return Err(bad("payload.initramfs", "", "empty path")),
            other => other.map(PathBuf::from),
        };
        let serial = SerialMode::from_config(&self.serial)
            .map_err(|r| bad("serial.mode", format!("{:?}", self.serial.mode), r))?;
        if let Some(c) = &self.console {
            if !matches!(c.mode, ConsoleMode::Off | ConsoleMode::Null) {
                return Err(bad(
                    "console.mode",
                    format!("{:?}", c.mode),
                    "there is no virtio console here: only Off or Null (use serial)",
                ));
            }
        }
        let mut disks = Vec::new();
        let mut vhost_user_disks = Vec::new();
        for (index, d) in self.disks.iter().flatten().enumerate() {
            match d.resolve() {
                Ok(ResolvedDisk::Local(c)) => disks.push(*c),
                Ok(ResolvedDisk::VhostUser(c)) => vhost_user_disks.push(c),
                Err(error) => return Err(VmConfigError::Disk { index, error }),
            }
        }
        let mut ids: Vec<&str> = self
            .disks
            .iter()
            .flatten()
            .filter_map(|d| d.id.as_deref())
            .collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(VmConfigError::DuplicateDiskId(w[0].to_string()));
        }
        if !vhost_user_disks.is_empty() && !self.memory.shared {
            return Err(VmConfigError::VhostUserNeedsSharedMemory);
        }
        Ok(BootConfig {
            kernel,
            initramfs,
            cmdline: payload.cmdline.unwrap_or_default(),
            cpus,
            cpu_model,
            memory,
            shared_memory: self.memory.shared,
            disks,
            vhost_user_disks,
            serial,
        })
    }
}
