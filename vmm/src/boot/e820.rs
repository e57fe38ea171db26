//! The guest's memory map, shared by the PVH memmap and the Linux zero
//! page's e820 table. Enters as the RAM size; leaves as a list of
//! `(start, size, type)` entries.

use crate::layout::{EBDA_START, HIGH_RAM_START, LOW_RAM_END, RAM_64BIT_START};

pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

/// RAM below the EBDA, the reserved hole up to 1 MiB (MP table, legacy
/// ROM area), RAM to the end of low memory, and RAM above 4 GiB.
pub fn memory_map(ram_size: u64) -> Vec<E820Entry> {
    let low_end = ram_size.min(LOW_RAM_END);
    let mut m = vec![
        E820Entry {
            addr: 0,
            size: EBDA_START,
            kind: E820_RAM,
        },
        E820Entry {
            addr: EBDA_START,
            size: HIGH_RAM_START - EBDA_START,
            kind: E820_RESERVED,
        },
        E820Entry {
            addr: HIGH_RAM_START,
            size: low_end - HIGH_RAM_START,
            kind: E820_RAM,
        },
    ];
    if ram_size > low_end {
        m.push(E820Entry {
            addr: RAM_64BIT_START,
            size: ram_size - low_end,
            kind: E820_RAM,
        });
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_total_matches() {
        for size in [64u64 << 20, 4 << 30] {
            let m = memory_map(size);
            let ram: u64 = m
                .iter()
                .filter(|e| e.kind == E820_RAM)
                .map(|e| e.size)
                .sum();
            assert_eq!(ram, size - (HIGH_RAM_START - EBDA_START));
        }
    }
}
