//! A virtio device behind the virtio-pci modern transport: the PCI
//! function ([`PciConfig`] with MSI-X and virtio capabilities) and BAR 0,
//! which holds the common config, ISR, device config, notify area, and
//! the MSI-X table and PBA.
//!
//! Guest config cycles and BAR accesses enter through the `config_*` and
//! `bar_*` methods (the VMM calls them from vCPU threads). When the driver
//! sets DRIVER_OK, the enabled queues leave for the device in
//! [`VirtioDevice::activate`], each with its kick eventfd (which the VMM has
//! registered as a KVM ioeventfd on the queue's notify address); a status
//! write of 0 takes them back through [`VirtioDevice::reset`]. When the
//! guest moves BAR 0, [`VirtioPciDevice::config_write`] says so with a
//! [`BarMoved`], and the VMM moves the ioeventfds.

use std::sync::Arc;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::common_config::{CommonConfig, CommonWrite, COMMON_CONFIG_SIZE};
use super::error::TransportError;
use super::layout::{build_config, FunctionConfig};
pub use super::layout::{
    BAR_SIZE, COMMON_OFFSET, DEVICE_CFG_OFFSET, DEVICE_CFG_SIZE, ISR_OFFSET, MAX_VECTORS,
    MSIX_PBA_OFFSET, MSIX_TABLE_OFFSET, NOTIFY_MULTIPLIER, NOTIFY_OFFSET,
};
use super::msix::{MsiRouter, Msix};
use super::pci_config::PciConfig;
use super::status::{STATUS_DRIVER_OK, STATUS_FAILED, STATUS_FEATURES_OK, STATUS_NEEDS_RESET};
use crate::device::VirtioDevice;

/// Feature bits this transport cannot carry (packed rings, notification
/// data, queue reset, notification config data).
const TRANSPORT_UNSUPPORTED: u64 = (1 << 34) | (1 << 38) | (1 << 39) | (1 << 40);
const VIRTIO_F_VERSION_1: u64 = 1 << 32;
const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << 29;

/// Runs first in the thread that activates the device, so whatever it sets
/// up (the VMM installs the queue workers' seccomp filter) is inherited by
/// the worker threads the device spawns.
pub type ActivationHook = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What happened to the device, as the driver drove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceEvent {
    /// DRIVER_OK started the device.
    Activated,
    /// The driver reset an activated device (a status write of 0).
    Reset,
}

/// Told of each [`DeviceEvent`], after it happened (the VMM reports them
/// on its event monitor).
pub type EventObserver = Arc<dyn Fn(DeviceEvent) + Send + Sync>;

pub struct VirtioPciDevice {
    device: Box<dyn VirtioDevice>,
    activation_hook: Option<ActivationHook>,
    observer: Option<EventObserver>,
    config: PciConfig,
    common: CommonConfig,
    msix: Arc<Msix>,
    msix_cap: usize,
    pci_cfg_cap: usize,
    /// Per queue: the kick eventfd while the transport holds it (`None`
    /// while lent to the activated device), and a clone for notify writes
    /// that reach us instead of KVM.
    kicks: Vec<Option<EventFd>>,
    kick_clones: Vec<EventFd>,
    mem: Arc<GuestMemoryMmap>,
    activated: bool,
    /// The BAR 0 address the notify ioeventfds are registered at (as far
    /// as the VMM was told through [`BarMoved`]).
    notify_base: u64,
}

/// BAR 0 moved from `old` to `new` (both guest physical addresses) while
/// memory decoding is on: the notify ioeventfds registered at
/// [`VirtioPciDevice::notify_eventfds_at`]`(old)` belong at
/// `notify_eventfds_at(new)` now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarMoved {
    pub old: u64,
    pub new: u64,
}

impl VirtioPciDevice {
    /// Number of MSI-X vectors (and irqfds) a device with `queues` needs:
    /// one per queue plus one for config changes.
    pub fn vectors_needed(queues: usize) -> usize {
        queues + 1
    }

    /// Wraps `device` in a PCI function whose BAR 0 is at `bar_addr`.
    /// `irqfds[v]` is MSI-X vector `v`'s irqfd; `router` routes it.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: Arc<GuestMemoryMmap>,
        bar_addr: u32,
        irqfds: Vec<EventFd>,
        router: Arc<dyn MsiRouter>,
    ) -> Result<Self, TransportError> {
        let queues = device.queue_max_sizes().len();
        let needed = Self::vectors_needed(queues);
        if needed > MAX_VECTORS {
            return Err(TransportError::TooManyQueues {
                queues,
                needed,
                max: MAX_VECTORS,
            });
        }
        if irqfds.len() != needed {
            return Err(TransportError::IrqfdCount {
                got: irqfds.len(),
                needed,
            });
        }
        let FunctionConfig {
            config,
            msix_cap,
            pci_cfg_cap,
        } = build_config(device.device_type(), queues, bar_addr)?;

        let msix = Arc::new(Msix::new(irqfds, router, queues));
        let mut kicks = Vec::with_capacity(queues);
        let mut kick_clones = Vec::with_capacity(queues);
        for _ in 0..queues {
            let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(TransportError::CreateEventFd)?;
            kick_clones.push(fd.try_clone().map_err(TransportError::CreateEventFd)?);
            kicks.push(Some(fd));
        }
        Ok(VirtioPciDevice {
            common: CommonConfig::new(device.queue_max_sizes()),
            device,
            activation_hook: None,
            observer: None,
            config,
            msix,
            msix_cap,
            pci_cfg_cap,
            kicks,
            kick_clones,
            mem,
            activated: false,
            notify_base: u64::from(bar_addr & !(BAR_SIZE - 1)),
        })
    }

    /// With a hook, activation runs in a short-lived thread of its own
    /// that first calls the hook, so that the device's worker threads
    /// (spawned during activation) inherit what the hook set up, and the
    /// calling vCPU thread does not.
    pub fn set_activation_hook(&mut self, hook: ActivationHook) {
        self.activation_hook = Some(hook);
    }

    /// Tells `observer` of every activation and driver reset.
    pub fn set_event_observer(&mut self, observer: EventObserver) {
        self.observer = Some(observer);
    }

    pub(super) fn observe(&self, event: DeviceEvent) {
        if let Some(o) = &self.observer {
            o(event);
        }
    }

    /// Takes the device out of the function (a VM reboot moves it to a
    /// new one): an activated device is reset first, so its workers have
    /// drained and stopped; its state beyond the virtio registers (open
    /// image, counters) stays with it.
    pub fn into_device(mut self) -> Box<dyn VirtioDevice> {
        if self.activated {
            drop(self.device.reset());
            self.activated = false;
        }
        self.device
    }

    /// BAR 0's guest physical range `(start, len)`.
    pub fn bar_range(&self) -> (u64, u64) {
        (
            u64::from(self.config.bar_address()),
            u64::from(self.config.bar_size()),
        )
    }

    /// Whether the driver enabled memory decoding (command register bit
    /// 1); BAR accesses are ignored while it is off.
    pub fn decodes_memory(&self) -> bool {
        self.config.memory_enabled()
    }

    /// For ioeventfd registration: each queue's notify address (in BAR 0
    /// where the ioeventfds belong now) with a clone of its kick eventfd.
    pub fn notify_eventfds(&self) -> std::io::Result<Vec<(u64, EventFd)>> {
        self.notify_eventfds_at(self.notify_base)
    }

    /// Each queue's notify address if BAR 0 were at `bar`, with a clone of
    /// its kick eventfd (for moving registrations after a [`BarMoved`]).
    pub fn notify_eventfds_at(&self, bar: u64) -> std::io::Result<Vec<(u64, EventFd)>> {
        let base = bar.saturating_add(NOTIFY_OFFSET);
        self.kick_clones
            .iter()
            .enumerate()
            .map(|(q, fd)| {
                Ok((
                    base + u64::from(NOTIFY_MULTIPLIER) * q as u64,
                    fd.try_clone()?,
                ))
            })
            .collect()
    }

    fn device_features(&self) -> u64 {
        self.device.features() & !TRANSPORT_UNSUPPORTED
    }

    /// A config-space read (from the host bridge's 0xCFC window).
    pub fn config_read(&mut self, offset: usize, data: &mut [u8]) {
        let window = self.pci_cfg_cap + 16;
        if offset >= window && offset < window + 4 {
            let (bar_off, len) = self.pci_cfg_access();
            let mut buf = [0u8; 4];
            if let Some(b) = buf.get_mut(..len) {
                self.bar_read(bar_off, b);
            }
            for (i, d) in data.iter_mut().enumerate() {
                *d = buf.get(offset - window + i).copied().unwrap_or(0);
            }
            return;
        }
        self.config.read(offset, data);
    }

    /// A config-space write. Returns where BAR 0 moved if this write
    /// moved it (or enabled memory decoding on a BAR programmed while
    /// decoding was off), so the caller can move the notify ioeventfds.
    pub fn config_write(&mut self, offset: usize, data: &[u8]) -> Option<BarMoved> {
        let window = self.pci_cfg_cap + 16;
        if offset >= window && offset < window + 4 {
            let (bar_off, len) = self.pci_cfg_access();
            if offset == window && data.len() >= len {
                self.bar_write(bar_off, &data[..len]);
            }
            return None;
        }
        self.config.write(offset, data);
        let end = offset.saturating_add(data.len());
        let mc = self.msix_cap + 2;
        if offset < mc + 2 && end > mc {
            self.msix.set_message_control(self.config.get16(mc));
        }
        // BAR sizing (all-ones, read back, restore) happens with decoding
        // off, so only a decoded BAR is worth moving the ioeventfds to.
        let new = u64::from(self.config.bar_address());
        if self.config.memory_enabled() && new != self.notify_base {
            let moved = BarMoved {
                old: self.notify_base,
                new,
            };
            self.notify_base = new;
            return Some(moved);
        }
        None
    }

    /// The BAR offset and length the driver put in the PCI-config-access
    /// capability (length 1, 2 or 4, else 0).
    fn pci_cfg_access(&self) -> (u64, usize) {
        let c = self.pci_cfg_cap;
        let len = match self.config.get32(c + 12) {
            l @ (1 | 2 | 4) => l as usize,
            _ => 0,
        };
        if self.config.get16(c + 4) & 0xff != 0 {
            return (0, 0);
        }
        (u64::from(self.config.get32(c + 8)), len)
    }

    /// A read at `offset` within BAR 0.
    pub fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match offset {
            o if o < COMMON_CONFIG_SIZE => {
                let f = self.device_features();
                self.common.read(o - COMMON_OFFSET, data, f, &self.msix)
            }
            ISR_OFFSET => {
                if let Some(b) = data.first_mut() {
                    *b = self.msix.take_isr();
                }
            }
            o if (DEVICE_CFG_OFFSET..DEVICE_CFG_OFFSET + DEVICE_CFG_SIZE).contains(&o) => {
                self.device.read_config(o - DEVICE_CFG_OFFSET, data)
            }
            o if (MSIX_TABLE_OFFSET..MSIX_PBA_OFFSET).contains(&o) => {
                self.msix.table_read(o - MSIX_TABLE_OFFSET, data)
            }
            o if (MSIX_PBA_OFFSET..u64::from(BAR_SIZE)).contains(&o) => {
                self.msix.pba_read(o - MSIX_PBA_OFFSET, data)
            }
            _ => {}
        }
    }

    /// A write at `offset` within BAR 0.
    pub fn bar_write(&mut self, offset: u64, data: &[u8]) {
        // An empty write would read as value 0 (a status write of 0 is a
        // reset); vCPU exits never produce one, the PCI-config-access
        // window with an invalid length would.
        if data.is_empty() {
            return;
        }
        match offset {
            o if o < COMMON_CONFIG_SIZE => {
                if let CommonWrite::Status(s) = self.common.write(o, data, &self.msix) {
                    self.set_status(s);
                }
            }
            o if (DEVICE_CFG_OFFSET..DEVICE_CFG_OFFSET + DEVICE_CFG_SIZE).contains(&o) => {
                self.device.write_config(o - DEVICE_CFG_OFFSET, data)
            }
            o if (NOTIFY_OFFSET..MSIX_TABLE_OFFSET).contains(&o) => {
                let q = (o - NOTIFY_OFFSET) / u64::from(NOTIFY_MULTIPLIER);
                // Normally KVM's ioeventfd catches these without an exit.
                log::debug!("queue {q} notify reached the transport (no ioeventfd hit)");
                if let Some(fd) = usize::try_from(q)
                    .ok()
                    .and_then(|q| self.kick_clones.get(q))
                {
                    if let Err(e) = fd.write(1) {
                        log::error!("cannot kick queue {q}: {e}");
                    }
                }
            }
            o if (MSIX_TABLE_OFFSET..MSIX_PBA_OFFSET).contains(&o) => {
                self.msix.table_write(o - MSIX_TABLE_OFFSET, data)
            }
            _ => {}
        }
    }

    fn set_status(&mut self, new: u8) {
        if new == 0 {
            self.reset();
            return;
        }
        let old = self.common.status;
        let mut status = new;
        if new & STATUS_FEATURES_OK != 0 && old & STATUS_FEATURES_OK == 0 {
            let offered = self.device_features();
            let wanted = self.common.driver_features;
            if wanted & !offered != 0 || wanted & VIRTIO_F_VERSION_1 == 0 {
                log::warn!(
                    "driver asked for features {wanted:#x}, device offers {offered:#x}: refusing FEATURES_OK"
                );
                status &= !STATUS_FEATURES_OK;
            } else {
                self.device.ack_features(wanted);
            }
        }
        self.common.status = status;
        if status & STATUS_DRIVER_OK != 0
            && status & STATUS_FEATURES_OK != 0
            && status & STATUS_FAILED == 0
            && !self.activated
        {
            if let Err(e) = self.activate() {
                log::error!("virtio device activation failed: {e}");
                self.common.status |= STATUS_NEEDS_RESET;
                if let Err(e) = self.msix.signal(self.msix.config_vector()) {
                    log::error!("cannot signal the config change: {e}");
                }
            }
        }
    }

    fn reset(&mut self) {
        if self.activated {
            // The returned eventfds are clones of ours; dropping them
            // closes only those descriptors.
            drop(self.device.reset());
            self.restore_kicks();
            self.activated = false;
            self.observe(DeviceEvent::Reset);
        }
        self.common.reset();
        self.msix.reset_vectors();
    }

    /// VM shutdown: the device drains and flushes.
    pub fn shutdown(&mut self) {
        self.device.shutdown();
        self.activated = false;
    }
}

mod activation;
#[cfg(test)]
mod tests;
