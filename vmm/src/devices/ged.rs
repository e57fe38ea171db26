//! The Generic Event Device's event register, at
//! [`crate::layout::GED_EVENT_PORT`]: which of the GED's own events are
//! pending (bit 0: the power button was pressed), with the GED's
//! power-button interrupt (an irqfd on
//! [`crate::layout::POWER_BUTTON_IRQ`]); the DSDT's `\_SB.GED_._EVT`
//! for that interrupt reads this register (which clears it) and notifies
//! the power button device `\_SB.PWRB` (`boot/acpi/power_button.rs`).
//! A guest without ACPI polls the register instead.
//!
//! The control loop presses the button ([`GedEvents::press_power_button`],
//! `vm.power-button`); the guest reads the register. Only 32-bit reads
//! at offset 0 return anything.

use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// The power button was pressed.
pub const POWER_BUTTON: u32 = 1 << 0;
/// Bytes of register space.
pub const REGISTER_BYTES: u64 = 4;

pub struct GedEvents {
    pending: u32,
    /// The GED's power-button irqfd.
    irq: EventFd,
}

impl GedEvents {
    pub fn new(irq: EventFd) -> Self {
        GedEvents { pending: 0, irq }
    }

    /// Sets the power button's bit and raises the GED interrupt.
    pub fn press_power_button(&mut self) {
        self.pending |= POWER_BUTTON;
        if let Err(e) = self.irq.write(1) {
            log::error!("cannot raise the GED interrupt: {e}");
        }
    }
}

impl BusDevice for GedEvents {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == 0 && data.len() == 4 {
            data.copy_from_slice(&std::mem::take(&mut self.pending).to_le_bytes());
        }
    }

    fn write(&mut self, _base: u64, _offset: u64, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    use super::*;

    #[test]
    fn the_button_raises_the_interrupt_and_reads_once() {
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let mut g = GedEvents::new(irq.try_clone().unwrap());
        let mut v = [0u8; 4];
        g.read(0, 0, &mut v);
        assert_eq!(u32::from_le_bytes(v), 0);
        g.press_power_button();
        assert_eq!(irq.read().unwrap(), 1);
        let mut odd = [0u8; 2];
        g.read(0, 0, &mut odd);
        assert_eq!(odd, [0, 0], "odd sizes read nothing and clear nothing");
        g.read(0, 0, &mut v);
        assert_eq!(u32::from_le_bytes(v), POWER_BUTTON);
        g.read(0, 0, &mut v);
        assert_eq!(u32::from_le_bytes(v), 0, "read clears");
    }
}
