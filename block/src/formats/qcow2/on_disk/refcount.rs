//! Refcount entries inside a refcount block, for every refcount width
//! (refcount_order 0..=6, 1 to 64 bits).
//!
//! A refcount block's raw bytes enter; entry values leave (and are written
//! back into the bytes). Sub-byte widths are packed least significant bit
//! first within each byte, wider ones are big-endian, as qemu stores them.
//! `check` reuses [`read_refcount_entry`].

/// Value of entry `index` of a refcount block of width `1 << order` bits.
/// The caller keeps `index` below `block.len() * 8 >> order`.
pub(crate) fn read_refcount_entry(block: &[u8], index: usize, order: u32) -> u64 {
    let bits = 1usize << order;
    match order {
        0..=2 => {
            let bit = index * bits;
            let byte = block[bit / 8];
            (u64::from(byte) >> (bit % 8)) & ((1u64 << bits) - 1)
        }
        _ => {
            let n = bits / 8;
            let start = index * n;
            block[start..start + n]
                .iter()
                .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
        }
    }
}

/// Stores `value` (already checked against [`max_refcount`]) in entry
/// `index`; returns the byte range that changed.
pub(crate) fn write_refcount_entry(
    block: &mut [u8],
    index: usize,
    order: u32,
    value: u64,
) -> std::ops::Range<usize> {
    let bits = 1usize << order;
    match order {
        0..=2 => {
            let bit = index * bits;
            let mask = (((1u16 << bits) - 1) as u8) << (bit % 8);
            let b = &mut block[bit / 8];
            *b = (*b & !mask) | (((value as u8) << (bit % 8)) & mask);
            bit / 8..bit / 8 + 1
        }
        _ => {
            let n = bits / 8;
            let start = index * n;
            let bytes = value.to_be_bytes();
            block[start..start + n].copy_from_slice(&bytes[8 - n..]);
            start..start + n
        }
    }
}

/// Largest refcount of width `1 << order` bits.
pub(crate) fn max_refcount(order: u32) -> u64 {
    if order >= 6 {
        u64::MAX
    } else {
        (1u64 << (1u32 << order)) - 1
    }
}

/// Entries per refcount block.
pub(crate) fn entries_per_block(cluster_bits: u32, order: u32) -> u64 {
    (1u64 << (cluster_bits + 3)) >> order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_order() {
        for order in 0..=6u32 {
            let mut block = vec![0u8; 512];
            let n = entries_per_block(9, order) as usize;
            let max = max_refcount(order);
            for i in 0..n {
                let v = (i as u64 * 7 + 1) & max;
                write_refcount_entry(&mut block, i, order, v);
            }
            for i in 0..n {
                assert_eq!(
                    read_refcount_entry(&block, i, order),
                    (i as u64 * 7 + 1) & max,
                    "order {order} i {i}"
                );
            }
        }
    }

    #[test]
    fn layout_matches_qemu() {
        let mut b = vec![0u8; 8];
        write_refcount_entry(&mut b, 1, 0, 1);
        assert_eq!(b[0], 0b10);
        write_refcount_entry(&mut b, 1, 4, 0x1234);
        assert_eq!(&b[2..4], &[0x12, 0x34]);
        assert_eq!(max_refcount(0), 1);
        assert_eq!(max_refcount(4), 65535);
        assert_eq!(entries_per_block(16, 4), 32768);
    }
}
