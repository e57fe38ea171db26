//! The ACPI registers of our hardware-reduced machine, at
//! [`crate::layout::ACPI_PM_PORT`]: sleep control (the guest writes
//! SLP_TYP and SLP_EN to enter a sleep state; `\_S5` in the DSDT makes
//! that power-off), sleep status (reads "woken"), and the FADT's reset
//! register. Power-off and reset leave as a request on the VMM's
//! [`ExitSignal`], which stops the vCPUs and drains, flushes and closes
//! every disk before the process exits.

use std::sync::Arc;

use super::acpi_pm_registers::{
    RESET_OFFSET, RESET_VALUE, S5_SLEEP_TYPE, SLEEP_CONTROL_OFFSET, SLEEP_STATUS_OFFSET,
};
use super::bus::BusDevice;
use crate::exit::{ExitReason, ExitSignal};

/// Registers in the block.
pub const PORT_COUNT: u64 = 3;

const SLP_EN: u8 = 1 << 5;
const WAK_STS: u8 = 1 << 7;

pub struct AcpiPm {
    exit: Arc<ExitSignal>,
}

impl AcpiPm {
    pub fn new(exit: Arc<ExitSignal>) -> Self {
        AcpiPm { exit }
    }
}

impl BusDevice for AcpiPm {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == u64::from(SLEEP_STATUS_OFFSET) {
            if let Some(b) = data.first_mut() {
                *b = WAK_STS;
            }
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        let Some(&v) = data.first() else {
            return;
        };
        match u16::try_from(offset) {
            Ok(SLEEP_CONTROL_OFFSET) if v & SLP_EN != 0 => {
                let sleep_type = (v >> 2) & 0x7;
                if sleep_type == S5_SLEEP_TYPE {
                    log::info!("guest entered ACPI S5: powering off");
                    self.exit.request(ExitReason::PowerOff);
                } else {
                    // Only \_S5 is declared, so a guest has no reason
                    // to ask for another state.
                    log::warn!("guest asked for ACPI sleep type {sleep_type}: ignored");
                }
            }
            Ok(RESET_OFFSET) if v == RESET_VALUE => {
                log::info!("guest requested a reset through the ACPI reset register");
                self.exit.request(ExitReason::Reset);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pm() -> (AcpiPm, Arc<ExitSignal>) {
        let exit = Arc::new(ExitSignal::new().unwrap());
        (AcpiPm::new(exit.clone()), exit)
    }

    #[test]
    fn s5_with_slp_en_powers_off() {
        let (mut pm, exit) = pm();
        // Sleep type 5 without SLP_EN, other sleep types, odd sizes and
        // offsets: nothing happens.
        pm.write(0x600, 0, &[5 << 2]);
        pm.write(0x600, 0, &[(3 << 2) | SLP_EN]);
        pm.write(0x600, 0, &[]);
        pm.write(0x600, 3, &[(5 << 2) | SLP_EN]);
        pm.write(0x600, 2, &[0xfe]);
        assert_eq!(exit.peek(), None);
        let mut st = [0u8; 2];
        pm.read(0x600, 1, &mut st);
        assert_eq!(st, [WAK_STS, 0]);
        pm.write(0x600, 0, &[(5 << 2) | SLP_EN]);
        assert_eq!(exit.peek(), Some(ExitReason::PowerOff));
    }

    #[test]
    fn reset_register_requests_a_reset() {
        let (mut pm, exit) = pm();
        pm.write(0x600, 2, &[RESET_VALUE, 0, 0, 0]);
        assert_eq!(exit.peek(), Some(ExitReason::Reset));
    }
}
