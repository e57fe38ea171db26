//! The PCI configuration space (type 0 header) of a virtio-pci function:
//! IDs, command/status, one 32-bit memory BAR, and the capability list
//! (MSI-X and the virtio vendor capabilities).
//!
//! Guest config cycles enter through [`PciConfig::read`] /
//! [`PciConfig::write`]; each byte has a write mask, so read-only fields
//! stay put and BAR sizing (write all-ones, read back the size mask) works.
//! The transport intercepts the few registers with side effects (MSI-X
//! message control, the PCI-config-access window).

/// Size of a conventional config space.
pub const CONFIG_SIZE: usize = 256;

// Header offsets.
pub const VENDOR_ID: usize = 0x00;
pub const DEVICE_ID: usize = 0x02;
pub const COMMAND: usize = 0x04;
pub const STATUS: usize = 0x06;
pub const REVISION: usize = 0x08;
pub const CLASS_PROG: usize = 0x09;
pub const BAR0: usize = 0x10;
pub const SUBSYS_VENDOR: usize = 0x2c;
pub const SUBSYS_ID: usize = 0x2e;
pub const CAP_PTR: usize = 0x34;
pub const INTERRUPT_LINE: usize = 0x3c;

const STATUS_CAP_LIST: u16 = 1 << 4;
/// Memory space, bus master, I/O space, INTx disable.
const COMMAND_WRITABLE: u16 = 0x0407;

pub struct PciConfig {
    regs: [u8; CONFIG_SIZE],
    wmask: [u8; CONFIG_SIZE],
    bar_size: u32,
    /// Where the next capability goes, and the previous one's next pointer.
    next_cap: usize,
    last_cap_next: Option<usize>,
}

impl PciConfig {
    /// A header for `vendor:device` with class bytes `class` (class,
    /// subclass, prog-if) and one 32-bit non-prefetchable memory BAR of
    /// `bar_size` bytes (a power of two >= 4 KiB) at `bar_addr`.
    pub fn new(
        vendor: u16,
        device: u16,
        revision: u8,
        class: [u8; 3],
        subsystem: (u16, u16),
        bar_addr: u32,
        bar_size: u32,
    ) -> Self {
        let mut c = PciConfig {
            regs: [0; CONFIG_SIZE],
            wmask: [0; CONFIG_SIZE],
            bar_size,
            next_cap: 0x40,
            last_cap_next: None,
        };
        c.put16(VENDOR_ID, vendor);
        c.put16(DEVICE_ID, device);
        c.put16(STATUS, STATUS_CAP_LIST);
        c.regs[REVISION] = revision;
        c.regs[CLASS_PROG] = class[2];
        c.regs[CLASS_PROG + 1] = class[1];
        c.regs[CLASS_PROG + 2] = class[0];
        c.put16(SUBSYS_VENDOR, subsystem.0);
        c.put16(SUBSYS_ID, subsystem.1);
        c.wmask[COMMAND..COMMAND + 2].copy_from_slice(&COMMAND_WRITABLE.to_le_bytes());
        c.wmask[INTERRUPT_LINE] = 0xff;
        let bar_mask = !(bar_size.max(16) - 1);
        c.wmask[BAR0..BAR0 + 4].copy_from_slice(&bar_mask.to_le_bytes());
        c.put32(BAR0, bar_addr & bar_mask);
        c
    }

    fn put16(&mut self, off: usize, v: u16) {
        self.regs[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, off: usize, v: u32) {
        self.regs[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    pub fn get32(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        if let Some(s) = self.regs.get(off..off + 4) {
            b.copy_from_slice(s);
        }
        u32::from_le_bytes(b)
    }

    pub fn get16(&self, off: usize) -> u16 {
        let mut b = [0u8; 2];
        if let Some(s) = self.regs.get(off..off + 2) {
            b.copy_from_slice(s);
        }
        u16::from_le_bytes(b)
    }

    /// Appends a capability: `body` starts with the capability ID; the
    /// next pointer (byte 1) is filled in here. `writable` lists
    /// `(offset within cap, len)` byte ranges the guest may write.
    /// Returns the capability's offset, or `None` if config space is full.
    pub fn add_capability(&mut self, body: &[u8], writable: &[(usize, usize)]) -> Option<usize> {
        let off = self.next_cap;
        let end = off.checked_add(body.len())?;
        if body.len() < 2 || end > CONFIG_SIZE {
            return None;
        }
        self.regs[off..end].copy_from_slice(body);
        self.regs[off + 1] = 0;
        for &(o, l) in writable {
            for b in &mut self.wmask[off + o..off + o + l] {
                *b = 0xff;
            }
        }
        match self.last_cap_next {
            None => self.regs[CAP_PTR] = u8::try_from(off).ok()?,
            Some(p) => self.regs[p] = u8::try_from(off).ok()?,
        }
        self.last_cap_next = Some(off + 1);
        // Capabilities are dword aligned.
        self.next_cap = (end + 3) & !3;
        Some(off)
    }

    /// Reads `data.len()` bytes at `offset`; beyond the space reads ones.
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i)
                .and_then(|o| self.regs.get(o))
                .copied()
                .unwrap_or(0xff);
        }
    }

    /// Writes through the per-byte mask.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        for (i, &v) in data.iter().enumerate() {
            let Some(o) = offset.checked_add(i) else {
                return;
            };
            if o >= CONFIG_SIZE {
                return;
            }
            let m = self.wmask[o];
            self.regs[o] = (self.regs[o] & !m) | (v & m);
        }
    }

    /// Overrides one byte's write mask (for registers with partly
    /// writable bits).
    pub fn set_write_mask(&mut self, offset: usize, mask: u8) {
        if let Some(m) = self.wmask.get_mut(offset) {
            *m = mask;
        }
    }

    /// Where BAR 0 currently is (as the guest programmed it).
    pub fn bar_address(&self) -> u32 {
        self.get32(BAR0) & !0xf
    }

    pub fn bar_size(&self) -> u32 {
        self.bar_size
    }

    /// Whether the guest enabled memory decoding.
    pub fn memory_enabled(&self) -> bool {
        self.get16(COMMAND) & 0x2 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PciConfig {
        PciConfig::new(
            0x1af4,
            0x1042,
            1,
            [1, 0x80, 0],
            (0x1af4, 0x40),
            0xe000_0000,
            0x8000,
        )
    }

    #[test]
    fn bar_sizing_and_relocation() {
        let mut c = cfg();
        assert_eq!(c.get32(BAR0), 0xe000_0000);
        c.write(BAR0, &[0xff; 4]);
        assert_eq!(c.get32(BAR0), 0xffff_8000, "size mask after all-ones");
        c.write(BAR0, &0xe001_0000u32.to_le_bytes());
        assert_eq!(c.bar_address(), 0xe001_0000);
    }

    #[test]
    fn read_only_fields_and_capability_chain() {
        let mut c = cfg();
        c.write(VENDOR_ID, &[0, 0]);
        assert_eq!(c.get16(VENDOR_ID), 0x1af4);
        let a = c.add_capability(&[0x11, 0xaa, 1, 2], &[(2, 2)]).unwrap();
        let b = c.add_capability(&[0x09, 0xbb, 3], &[]).unwrap();
        assert_eq!(c.regs[CAP_PTR] as usize, a);
        assert_eq!(c.regs[a + 1] as usize, b);
        assert_eq!(c.regs[b + 1], 0);
        c.write(a + 2, &[7, 7]);
        c.write(b + 2, &[7]);
        assert_eq!((c.regs[a + 2], c.regs[b + 2]), (7, 3));
        let mut out = [0u8; 4];
        c.read(254, &mut out);
        assert_eq!(out[2..], [0xff, 0xff]);
    }
}
