//! The PCI hotplug registers at [`crate::layout::PCI_HOTPLUG_PORT`], the
//! hardware side of the DSDT's ACPI PCI hotplug (`boot/acpi/hotplug.rs`),
//! Cloud Hypervisor's layout in port I/O:
//!
//! | offset | register | access |
//! |---|---|---|
//! | 0 | PCIU: slots that got a function since the last read | read, clears |
//! | 4 | PCID: slots whose function the VMM wants to remove | read, clears |
//! | 8 | B0EJ: the guest ejects the slots whose bits it writes | write |
//!
//! The VMM's control loop sets bits with [`PciHotplug::announce_added`]
//! and [`PciHotplug::request_removal`], each of which raises the Generic
//! Event Device's interrupt. A guest write to B0EJ (from a slot's `_EJ0`,
//! or a guest without ACPI that drives the registers itself) records the
//! slots and wakes the control loop through [`PciHotplug::eject_event`];
//! the loop takes them with [`PciHotplug::take_ejected`]. Only aligned
//! 32-bit accesses do anything.

use std::io;

use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

pub const PCIU_OFFSET: u64 = 0;
pub const PCID_OFFSET: u64 = 4;
pub const B0EJ_OFFSET: u64 = 8;
/// Bytes of register space.
pub const REGISTER_BYTES: u64 = 12;

pub struct PciHotplug {
    added: u32,
    removing: u32,
    ejected: u32,
    /// Raises the GED interrupt (an irqfd).
    irq: EventFd,
    /// Wakes the control loop after an eject.
    eject_evt: EventFd,
}

impl PciHotplug {
    /// `irq` is the GED's irqfd; `eject_evt` wakes the control loop (it
    /// outlives the VM: every boot's registers signal the same one).
    pub fn new(irq: EventFd, eject_evt: EventFd) -> Self {
        PciHotplug {
            added: 0,
            removing: 0,
            ejected: 0,
            irq,
            eject_evt,
        }
    }

    /// The eventfd a guest eject signals.
    pub fn eject_event(&self) -> io::Result<EventFd> {
        self.eject_evt.try_clone()
    }

    fn bit(slot: usize) -> u32 {
        u32::try_from(slot)
            .ok()
            .and_then(|s| 1u32.checked_shl(s))
            .unwrap_or(0)
    }

    fn notify(&self) {
        if let Err(e) = self.irq.write(1) {
            log::error!("cannot raise the hotplug interrupt: {e}");
        }
    }

    /// Tells the guest a function appeared in `slot`.
    pub fn announce_added(&mut self, slot: usize) {
        self.added |= Self::bit(slot);
        self.removing &= !Self::bit(slot);
        self.notify();
    }

    /// Asks the guest to release `slot` and eject it.
    pub fn request_removal(&mut self, slot: usize) {
        self.removing |= Self::bit(slot);
        self.added &= !Self::bit(slot);
        self.notify();
    }

    /// Forgets a pending announcement for `slot` (its function is gone).
    pub fn forget(&mut self, slot: usize) {
        self.added &= !Self::bit(slot);
        self.removing &= !Self::bit(slot);
        self.ejected &= !Self::bit(slot);
    }

    /// The slots the guest ejected since the last call.
    pub fn take_ejected(&mut self) -> Vec<usize> {
        let _ = self.eject_evt.read();
        let bits = std::mem::take(&mut self.ejected);
        (0..32).filter(|s| bits & (1 << s) != 0).collect()
    }
}

impl BusDevice for PciHotplug {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if data.len() != 4 {
            return;
        }
        let v = match offset {
            PCIU_OFFSET => std::mem::take(&mut self.added),
            PCID_OFFSET => std::mem::take(&mut self.removing),
            _ => 0,
        };
        data.copy_from_slice(&v.to_le_bytes());
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        let Ok(b) = <[u8; 4]>::try_from(data) else {
            return;
        };
        if offset != B0EJ_OFFSET {
            return;
        }
        // Slot 0 is the host bridge: never ejectable.
        let v = u32::from_le_bytes(b) & !1;
        if v == 0 {
            return;
        }
        self.ejected |= v;
        if let Err(e) = self.eject_evt.write(1) {
            log::error!("cannot signal a PCI eject: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;

    fn read(h: &mut PciHotplug, off: u64) -> u32 {
        let mut d = [0u8; 4];
        h.read(0, off, &mut d);
        u32::from_le_bytes(d)
    }

    #[test]
    fn registers_clear_on_read_and_ejects_reach_the_loop() {
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut h = PciHotplug::new(
            irq.try_clone().unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        );
        h.announce_added(3);
        assert_eq!(irq.read().unwrap(), 1);
        assert_eq!(read(&mut h, PCIU_OFFSET), 1 << 3);
        assert_eq!(read(&mut h, PCIU_OFFSET), 0);
        h.request_removal(3);
        h.request_removal(40); // no such slot: no bit
        assert_eq!(read(&mut h, PCID_OFFSET), 1 << 3);
        let evt = h.eject_event().unwrap();
        assert!(evt.read().is_err(), "nothing ejected yet");
        // Odd sizes, other offsets and the host bridge's bit do nothing.
        h.write(0, B0EJ_OFFSET, &[0xff]);
        h.write(0, PCIU_OFFSET, &8u32.to_le_bytes());
        h.write(0, B0EJ_OFFSET, &1u32.to_le_bytes());
        assert!(h.take_ejected().is_empty());
        h.write(0, B0EJ_OFFSET, &(1u32 << 3).to_le_bytes());
        assert_eq!(evt.read().unwrap(), 1);
        assert_eq!(h.take_ejected(), vec![3]);
        assert!(h.take_ejected().is_empty());
        let mut short = [0u8; 2];
        h.read(0, PCIU_OFFSET, &mut short);
        assert_eq!(short, [0, 0]);
    }
}
