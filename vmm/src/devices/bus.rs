//! Address decoding for port I/O and MMIO exits: a sorted list of
//! non-overlapping ranges, each owned by a [`BusDevice`].
//!
//! vCPU threads enter with an address and a buffer; the owning device gets
//! the offset within its range. Unclaimed reads return all-ones and
//! unclaimed writes are dropped, as on real hardware.

use std::sync::{Arc, Mutex, PoisonError};

/// A device on a bus. `base` is the start of the range the access hit.
pub trait BusDevice: Send {
    fn read(&mut self, base: u64, offset: u64, data: &mut [u8]);
    fn write(&mut self, base: u64, offset: u64, data: &[u8]);
}

#[derive(Debug, thiserror::Error)]
#[error("bus range {start:#x}+{len:#x} overlaps an existing device or is empty")]
pub struct BusOverlap {
    pub start: u64,
    pub len: u64,
}

type Entry = (u64, u64, Arc<Mutex<dyn BusDevice>>);

#[derive(Default)]
pub struct Bus {
    ranges: Vec<Entry>,
}

impl Bus {
    pub fn insert(
        &mut self,
        start: u64,
        len: u64,
        dev: Arc<Mutex<dyn BusDevice>>,
    ) -> Result<(), BusOverlap> {
        let end = start.checked_add(len).filter(|_| len > 0);
        let Some(end) = end else {
            return Err(BusOverlap { start, len });
        };
        if self
            .ranges
            .iter()
            .any(|&(s, l, _)| start < s + l && s < end)
        {
            return Err(BusOverlap { start, len });
        }
        let at = self.ranges.partition_point(|&(s, _, _)| s < start);
        self.ranges.insert(at, (start, len, dev));
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<&Entry> {
        let i = self.ranges.partition_point(|&(s, _, _)| s <= addr);
        let e = self.ranges.get(i.checked_sub(1)?)?;
        (addr - e.0 < e.1).then_some(e)
    }

    /// Returns false if no device claims `addr` (the caller fills ones).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((s, _, d)) => {
                d.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .read(*s, addr - s, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((s, _, d)) => {
                d.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .write(*s, addr - s, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo(Vec<(u64, u64)>);
    impl BusDevice for Echo {
        fn read(&mut self, _: u64, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, base: u64, offset: u64, _: &[u8]) {
            self.0.push((base, offset));
        }
    }

    #[test]
    fn decode_and_overlap() {
        let mut bus = Bus::default();
        let dev = Arc::new(Mutex::new(Echo(Vec::new())));
        bus.insert(0x3f8, 8, dev.clone()).unwrap();
        bus.insert(0x60, 5, dev.clone()).unwrap();
        assert!(bus.insert(0x3fa, 2, dev.clone()).is_err());
        assert!(bus.insert(0x10, 0, dev.clone()).is_err());
        let mut b = [0u8; 1];
        assert!(bus.read(0x3fd, &mut b));
        assert_eq!(b[0], 5);
        assert!(!bus.read(0x400, &mut b));
        assert_eq!(b[0], 0xff);
        assert!(bus.write(0x64, &[0xfe]));
        assert_eq!(dev.lock().unwrap().0, vec![(0x60, 4)]);
    }
}
