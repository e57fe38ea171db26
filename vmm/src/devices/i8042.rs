//! The bit of the i8042 keyboard controller a guest uses to reboot:
//! writing 0xFE (pulse reset line) to the command port 0x64. Everything
//! else reads as "no data". A reset request leaves as a write to the
//! VMM's exit eventfd with [`crate::exit::ExitReason::Reset`].

use std::sync::Arc;

use super::bus::BusDevice;
use crate::exit::ExitSignal;

const CMD_RESET: u8 = 0xfe;
/// Offset of the command/status port (0x64) from the data port (0x60).
const COMMAND_OFFSET: u64 = 4;

pub struct I8042 {
    exit: Arc<ExitSignal>,
}

impl I8042 {
    pub fn new(exit: Arc<ExitSignal>) -> Self {
        I8042 { exit }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _base: u64, _offset: u64, data: &mut [u8]) {
        // Status: output buffer empty, input buffer empty.
        data.fill(0);
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        if offset == COMMAND_OFFSET && data.first() == Some(&CMD_RESET) {
            log::info!("guest requested a reset through the i8042");
            self.exit.request(crate::exit::ExitReason::Reset);
        }
    }
}
