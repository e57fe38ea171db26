//! PCI bus 0: the host bridge's configuration mechanism #1 (address port
//! 0xCF8, data ports 0xCFC..0xCFF), a host bridge function at 00:00.0,
//! and the virtio-pci functions in slots 00:01.0 to 00:1f.0 (hot-plugged
//! ones take the first free slot, unplugged ones leave it empty); plus the 32-bit MMIO
//! window that routes BAR accesses to whichever function's BAR 0 holds
//! the address (so a guest that moves a BAR keeps working).
//!
//! Enters as port and MMIO exits; leaves as config cycles and BAR accesses
//! on a [`VirtioPciDevice`], and, when a config write moves a BAR, as
//! ioeventfd moves on a [`NotifyRegistry`].

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use virtio_devices::transport::{BarMoved, VirtioPciDevice};
use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

const ENABLE_BIT: u32 = 1 << 31;
/// Maximum functions on bus 0 (device numbers 0..32, function 0 only).
pub const MAX_DEVICES: usize = 32;

/// The functions on bus 0, shared by the config ports and the MMIO window.
pub struct PciDevices {
    /// Slot `i + 1` holds `functions[i]`; slot 0 is the host bridge.
    functions: Vec<Option<Arc<Mutex<VirtioPciDevice>>>>,
}

impl Default for PciDevices {
    fn default() -> Self {
        PciDevices {
            functions: vec![None; MAX_DEVICES - 1],
        }
    }
}

impl PciDevices {
    /// The first free slot (1 and up), if any.
    pub fn free_slot(&self) -> Option<usize> {
        self.functions
            .iter()
            .position(Option::is_none)
            .map(|i| i + 1)
    }

    /// Puts a function in `slot` (from [`PciDevices::free_slot`]); false
    /// if the slot is taken or does not exist.
    pub fn insert(&mut self, slot: usize, dev: Arc<Mutex<VirtioPciDevice>>) -> bool {
        match slot.checked_sub(1).and_then(|i| self.functions.get_mut(i)) {
            Some(entry @ None) => {
                *entry = Some(dev);
                true
            }
            _ => false,
        }
    }

    /// Takes the function out of `slot`; its config space then reads as
    /// all ones (an empty slot).
    pub fn remove(&mut self, slot: usize) -> Option<Arc<Mutex<VirtioPciDevice>>> {
        slot.checked_sub(1)
            .and_then(|i| self.functions.get_mut(i))
            .and_then(Option::take)
    }

    /// Every function present, in slot order.
    pub fn functions(&self) -> Vec<Arc<Mutex<VirtioPciDevice>>> {
        self.functions.iter().flatten().cloned().collect()
    }
}

/// Where the queues' notify ioeventfds are registered (KVM in the VMM, a
/// recorder in tests).
pub trait NotifyRegistry: Send + Sync {
    fn register(&self, addr: u64, fd: &EventFd) -> io::Result<()>;
    fn unregister(&self, addr: u64, fd: &EventFd) -> io::Result<()>;
}

/// Moves `dev`'s notify ioeventfds after its BAR moved. A registration
/// that fails is logged: notify writes then exit to the VMM, and the
/// transport kicks the queue itself (slower, still correct).
fn move_notify(dev: &VirtioPciDevice, moved: BarMoved, registry: &dyn NotifyRegistry) {
    match dev.notify_eventfds_at(moved.old) {
        Ok(fds) => {
            for (addr, fd) in fds {
                if let Err(e) = registry.unregister(addr, &fd) {
                    log::warn!("cannot unregister the notify ioeventfd at {addr:#x}: {e}");
                }
            }
        }
        Err(e) => log::warn!("cannot clone notify eventfds: {e}"),
    }
    match dev.notify_eventfds_at(moved.new) {
        Ok(fds) => {
            for (addr, fd) in fds {
                if let Err(e) = registry.register(addr, &fd) {
                    log::warn!("cannot register the notify ioeventfd at {addr:#x}: {e}");
                }
            }
        }
        Err(e) => log::warn!("cannot clone notify eventfds: {e}"),
    }
    log::info!(
        "BAR 0 moved from {:#x} to {:#x}; notify ioeventfds follow",
        moved.old,
        moved.new
    );
}

/// The host bridge's config space: Intel 440FX-compatible IDs, class
/// "host bridge", nothing writable.
fn host_bridge_read(offset: usize, data: &mut [u8]) {
    let mut regs = [0u8; 64];
    regs[0..2].copy_from_slice(&0x8086u16.to_le_bytes());
    regs[2..4].copy_from_slice(&0x1237u16.to_le_bytes());
    regs[0x0a] = 0x00; // subclass: host bridge
    regs[0x0b] = 0x06; // class: bridge
    for (i, b) in data.iter_mut().enumerate() {
        *b = regs.get(offset + i).copied().unwrap_or(0);
    }
}

/// Configuration mechanism #1 on ports 0xCF8..0xD00.
pub struct PciConfigPorts {
    devices: Arc<Mutex<PciDevices>>,
    registry: Arc<dyn NotifyRegistry>,
    address: u32,
}

impl PciConfigPorts {
    pub fn new(devices: Arc<Mutex<PciDevices>>, registry: Arc<dyn NotifyRegistry>) -> Self {
        PciConfigPorts {
            devices,
            registry,
            address: 0,
        }
    }

    /// The virtio function at device number `dev` (1 and up).
    fn function(&self, dev: usize) -> Option<Arc<Mutex<VirtioPciDevice>>> {
        let devs = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        devs.functions.get(dev.checked_sub(1)?).cloned().flatten()
    }

    /// The function and register offset the address register selects, if
    /// enabled and on bus 0, function 0.
    fn target(&self, port_offset: u64) -> Option<(usize, usize)> {
        if self.address & ENABLE_BIT == 0 {
            return None;
        }
        let bus = (self.address >> 16) & 0xff;
        let dev = ((self.address >> 11) & 0x1f) as usize;
        let func = (self.address >> 8) & 0x7;
        if bus != 0 || func != 0 {
            return None;
        }
        let reg = (self.address & 0xfc) as usize + (port_offset.saturating_sub(4) as usize);
        Some((dev, reg))
    }
}

impl BusDevice for PciConfigPorts {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        if offset < 4 {
            let b = self.address.to_le_bytes();
            for (i, d) in data.iter_mut().enumerate() {
                *d = b.get(offset as usize + i).copied().unwrap_or(0);
            }
            return;
        }
        data.fill(0xff);
        let Some((dev, reg)) = self.target(offset) else {
            return;
        };
        if dev == 0 {
            host_bridge_read(reg, data);
            return;
        }
        if let Some(f) = self.function(dev) {
            f.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .config_read(reg, data);
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        if offset < 4 {
            if offset == 0 && data.len() == 4 {
                let mut b = [0u8; 4];
                b.copy_from_slice(data);
                self.address = u32::from_le_bytes(b);
            }
            return;
        }
        let Some((dev, reg)) = self.target(offset) else {
            return;
        };
        if let Some(f) = self.function(dev) {
            let mut f = f.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(moved) = f.config_write(reg, data) {
                move_notify(&f, moved, &*self.registry);
            }
        }
    }
}

/// The 32-bit MMIO window: forwards an access to the function whose BAR 0
/// contains it and whose memory decoding is enabled.
pub struct PciMmioWindow {
    devices: Arc<Mutex<PciDevices>>,
}

impl PciMmioWindow {
    pub fn new(devices: Arc<Mutex<PciDevices>>) -> Self {
        PciMmioWindow { devices }
    }

    fn owner(&self, addr: u64) -> Option<(Arc<Mutex<VirtioPciDevice>>, u64)> {
        let devs = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        devs.functions.iter().flatten().find_map(|f| {
            let dev = f.lock().unwrap_or_else(PoisonError::into_inner);
            let (start, len) = dev.bar_range();
            let hit = dev.decodes_memory() && addr >= start && addr - start < len;
            hit.then(|| (f.clone(), addr - start))
        })
    }
}

impl BusDevice for PciMmioWindow {
    fn read(&mut self, base: u64, offset: u64, data: &mut [u8]) {
        match self.owner(base + offset) {
            Some((f, off)) => f
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .bar_read(off, data),
            None => data.fill(0xff),
        }
    }

    fn write(&mut self, base: u64, offset: u64, data: &[u8]) {
        if let Some((f, off)) = self.owner(base + offset) {
            f.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .bar_write(off, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use virtio_devices::device::{ActivateError, ActivatedQueue, VirtioInterrupt};
    use virtio_devices::transport::{MsiMessage, MsiRouter};
    use virtio_devices::VirtioDevice;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    /// Records (register?, address) pairs.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(bool, u64)>>);
    impl NotifyRegistry for Recorder {
        fn register(&self, addr: u64, _: &EventFd) -> io::Result<()> {
            self.0.lock().unwrap().push((true, addr));
            Ok(())
        }
        fn unregister(&self, addr: u64, _: &EventFd) -> io::Result<()> {
            self.0.lock().unwrap().push((false, addr));
            Ok(())
        }
    }

    struct NoRoutes;
    impl MsiRouter for NoRoutes {
        fn set_route(&self, _: u16, _: Option<MsiMessage>) -> io::Result<()> {
            Ok(())
        }
    }

    /// A two-queue device that does nothing.
    struct Idle;
    impl VirtioDevice for Idle {
        fn device_type(&self) -> u32 {
            2
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16, 16]
        }
        fn features(&self) -> u64 {
            1 << 32
        }
        fn ack_features(&mut self, _: u64) {}
        fn read_config(&self, _: u64, data: &mut [u8]) {
            data.fill(0);
        }
        fn write_config(&mut self, _: u64, _: &[u8]) {}
        fn activate(
            &mut self,
            _: Arc<GuestMemoryMmap>,
            _: Arc<dyn VirtioInterrupt>,
            _: Vec<ActivatedQueue>,
        ) -> Result<(), ActivateError> {
            Ok(())
        }
        fn reset(&mut self) -> Vec<EventFd> {
            Vec::new()
        }
        fn shutdown(&mut self) {}
    }

    fn ports_with_one_function() -> (PciConfigPorts, Arc<Recorder>) {
        let mem =
            Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
        let irqfds = (0..3)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
            .collect();
        let dev =
            VirtioPciDevice::new(Box::new(Idle), mem, 0xe000_0000, irqfds, Arc::new(NoRoutes))
                .unwrap();
        let devices = Arc::new(Mutex::new(PciDevices::default()));
        assert_eq!(devices.lock().unwrap().free_slot(), Some(1));
        assert!(devices.lock().unwrap().insert(1, Arc::new(Mutex::new(dev))));
        assert_eq!(devices.lock().unwrap().free_slot(), Some(2));
        let rec = Arc::new(Recorder::default());
        (PciConfigPorts::new(devices, rec.clone()), rec)
    }

    /// A config-space write to 00:01.0 through 0xCF8/0xCFC.
    fn write_fn1(ports: &mut PciConfigPorts, reg: u32, data: &[u8]) {
        let addr = ENABLE_BIT | (1 << 11) | (reg & 0xfc);
        ports.write(0xcf8, 0, &addr.to_le_bytes());
        ports.write(0xcf8, 4 + u64::from(reg & 3), data);
    }

    #[test]
    fn host_bridge_is_visible_and_empty_slots_read_ones() {
        let mut ports = PciConfigPorts::new(
            Arc::new(Mutex::new(PciDevices::default())),
            Arc::new(Recorder::default()),
        );
        ports.write(0xcf8, 0, &(ENABLE_BIT).to_le_bytes());
        let mut d = [0u8; 4];
        ports.read(0xcf8, 4, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x1237_8086);
        ports.write(0xcf8, 0, &(ENABLE_BIT | (3 << 11)).to_le_bytes());
        ports.read(0xcf8, 4, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0xffff_ffff);
        ports.read(0xcf8, 0, &mut d);
        assert_eq!(u32::from_le_bytes(d), ENABLE_BIT | (3 << 11));
    }

    #[test]
    fn moving_a_bar_moves_the_notify_ioeventfds() {
        let (mut ports, rec) = ports_with_one_function();
        // Linux-style: decoding off, size the BAR, program a new address,
        // decoding on. Only the last step moves the ioeventfds.
        write_fn1(&mut ports, 0x04, &0u16.to_le_bytes());
        write_fn1(&mut ports, 0x10, &[0xff; 4]);
        write_fn1(&mut ports, 0x10, &0xe080_0000u32.to_le_bytes());
        assert!(rec.0.lock().unwrap().is_empty());
        write_fn1(&mut ports, 0x04, &6u16.to_le_bytes());
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![
                (false, 0xe000_3000),
                (false, 0xe000_3004),
                (true, 0xe080_3000),
                (true, 0xe080_3004)
            ]
        );
        // Writing the same address again moves nothing.
        write_fn1(&mut ports, 0x10, &0xe080_0000u32.to_le_bytes());
        assert_eq!(rec.0.lock().unwrap().len(), 4);
    }

    #[test]
    fn a_removed_function_leaves_an_empty_slot() {
        let (mut ports, _) = ports_with_one_function();
        let mut d = [0u8; 4];
        ports.write(0xcf8, 0, &(ENABLE_BIT | (1 << 11)).to_le_bytes());
        ports.read(0xcf8, 4, &mut d);
        assert_eq!(u16::from_le_bytes([d[0], d[1]]), 0x1af4);
        let removed = ports.devices.lock().unwrap().remove(1);
        assert!(removed.is_some());
        assert!(ports.devices.lock().unwrap().remove(1).is_none());
        ports.read(0xcf8, 4, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0xffff_ffff);
        assert_eq!(ports.devices.lock().unwrap().free_slot(), Some(1));
    }

    #[test]
    fn hostile_port_accesses_do_not_panic() {
        let (mut ports, _) = ports_with_one_function();
        for addr in [
            0u32,
            ENABLE_BIT | 0xff_fffc,
            ENABLE_BIT | (31 << 11),
            u32::MAX,
        ] {
            ports.write(0xcf8, 0, &addr.to_le_bytes());
            for off in 0..8u64 {
                for len in [0usize, 1, 2, 3, 4, 8] {
                    let mut buf = vec![0u8; len];
                    ports.read(0xcf8, off, &mut buf);
                    ports.write(0xcf8, off, &vec![0xff; len]);
                }
            }
        }
        // Odd sizes on the address port leave it unchanged.
        ports.write(0xcf8, 0, &ENABLE_BIT.to_le_bytes());
        ports.write(0xcf8, 1, &[0xff, 0xff]);
        ports.write(0xcf8, 0, &[0x12, 0x34]);
        let mut d = [0u8; 4];
        ports.read(0xcf8, 0, &mut d);
        assert_eq!(u32::from_le_bytes(d), ENABLE_BIT);
    }
}
