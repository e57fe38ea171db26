//! Decoding L1 and L2 table entries (standard and extended L2).
//!
//! Raw big-endian words from the tables enter; a typed [`L2Entry`] (or the
//! state of one subcluster) leaves. Offsets are checked for alignment here;
//! the caller checks them against the file size. `check` reuses this.

use super::header::MAX_HOST_OFFSET;

/// Refcount of the cluster is exactly one: it may be written in place.
pub(crate) const OFLAG_COPIED: u64 = 1 << 63;
pub(crate) const OFLAG_COMPRESSED: u64 = 1 << 62;
/// v3 standard clusters: reads as zeroes.
pub(crate) const OFLAG_ZERO: u64 = 1;
/// Host offset bits 9..=55 of L1 entries and standard L2 entries.
pub(crate) const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;

/// One decoded L2 entry (the standard 64-bit part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum L2Entry {
    /// Falls through to the backing file (or zeroes).
    Unallocated,
    /// Reads as zeroes; may keep a preallocated host cluster.
    Zero {
        host: Option<u64>,
        copied: bool,
    },
    Normal {
        host: u64,
        copied: bool,
    },
    Compressed(CompressedDescriptor),
}

/// Where a compressed cluster's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CompressedDescriptor {
    pub host_offset: u64,
    /// Size in bytes as the descriptor gives it: up to the end of its last
    /// 512-byte sector (callers clamp it to the file).
    pub max_len: u64,
}

impl CompressedDescriptor {
    /// The host cluster indices whose refcounts this descriptor holds.
    pub fn clusters(&self, cluster_bits: u32) -> std::ops::RangeInclusive<u64> {
        let first = self.host_offset >> cluster_bits;
        let last = (self.host_offset + self.max_len - 1) >> cluster_bits;
        first..=last
    }
}

/// L1 entry: the L2 table offset (None when unallocated) and COPIED.
pub(crate) fn decode_l1(raw: u64, cluster_size: u64) -> Result<Option<(u64, bool)>, String> {
    let off = raw & OFFSET_MASK;
    if off == 0 {
        return Ok(None);
    }
    if !off.is_multiple_of(cluster_size) {
        return Err(format!("L2 table offset {off:#x} is not cluster aligned"));
    }
    Ok(Some((off, raw & OFLAG_COPIED != 0)))
}

/// Decodes the 64-bit descriptor of a standard or extended L2 entry.
pub(crate) fn decode_l2(
    raw: u64,
    cluster_bits: u32,
    version: u32,
    extended: bool,
) -> Result<L2Entry, String> {
    decode_l2_in(raw, cluster_bits, version, extended, false)
}

/// [`decode_l2`] for an image whose data may live in an external data
/// file: there, offset 0 is a real cluster, told apart from "unallocated"
/// by the COPIED flag (data file clusters always have refcount 1).
pub(crate) fn decode_l2_in(
    raw: u64,
    cluster_bits: u32,
    version: u32,
    extended: bool,
    data_file: bool,
) -> Result<L2Entry, String> {
    let copied = raw & OFLAG_COPIED != 0;
    if raw & OFLAG_COMPRESSED != 0 {
        // bits 0..x-1: offset, bits x..61: additional sectors, x = 62 - (cb - 8).
        let x = 62 - (cluster_bits - 8);
        let host_offset = raw & ((1u64 << x) - 1);
        let sectors = ((raw >> x) & ((1u64 << (62 - x)) - 1)) + 1;
        // The data starts inside the first sector and ends at the last one's end.
        let max_len = sectors * 512 - (host_offset & 511);
        if host_offset == 0 || host_offset >= MAX_HOST_OFFSET {
            return Err(format!(
                "compressed cluster offset {host_offset:#x} invalid"
            ));
        }
        return Ok(L2Entry::Compressed(CompressedDescriptor {
            host_offset,
            max_len,
        }));
    }
    let host = raw & OFFSET_MASK;
    let cluster_size = 1u64 << cluster_bits;
    if !host.is_multiple_of(cluster_size) {
        return Err(format!(
            "data cluster offset {host:#x} is not cluster aligned"
        ));
    }
    if !extended && version < 3 && raw & OFLAG_ZERO != 0 {
        // Version 2 has no zero flag: qemu treats the entry as corruption.
        return Err("zero cluster entry found in a version 2 image".into());
    }
    let zero = !extended && version >= 3 && raw & OFLAG_ZERO != 0;
    if data_file && host == 0 && copied {
        return Ok(if zero {
            L2Entry::Zero {
                host: Some(0),
                copied,
            }
        } else {
            L2Entry::Normal { host: 0, copied }
        });
    }
    Ok(match (zero, host) {
        (true, 0) => L2Entry::Zero { host: None, copied },
        (true, h) => L2Entry::Zero {
            host: Some(h),
            copied,
        },
        (false, 0) => L2Entry::Unallocated,
        (false, h) => L2Entry::Normal { host: h, copied },
    })
}

/// What one subcluster of an extended L2 entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SubclusterState {
    Allocated,
    Zero,
    Unallocated,
}

/// Subcluster `index` (0..32) of an extended entry's bitmap.
pub(crate) fn subcluster_state(bitmap: u64, index: u32) -> Result<SubclusterState, String> {
    let alloc = bitmap >> index & 1 != 0;
    let zero = bitmap >> (32 + index) & 1 != 0;
    match (alloc, zero) {
        (true, true) => Err(format!("subcluster {index} is both allocated and zero")),
        (true, false) => Ok(SubclusterState::Allocated),
        (false, true) => Ok(SubclusterState::Zero),
        (false, false) => Ok(SubclusterState::Unallocated),
    }
}

/// Encodes a compressed cluster descriptor for `len` bytes at host byte
/// offset `host` (x = 62 - (cluster_bits - 8): offset in bits 0..x, the
/// count of 512-byte sectors after the first in bits x..62).
pub(crate) fn compressed_entry(host: u64, len: u64, cluster_bits: u32) -> u64 {
    let x = 62 - (cluster_bits - 8);
    let extra_sectors = (host + len - 1) / 512 - host / 512;
    OFLAG_COMPRESSED | (extra_sectors << x) | host
}

/// Encodes a standard allocated entry with COPIED set.
pub(crate) fn normal_entry(host: u64) -> u64 {
    host | OFLAG_COPIED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_entries() {
        assert_eq!(decode_l2(0, 16, 3, false).unwrap(), L2Entry::Unallocated);
        assert_eq!(
            decode_l2(1, 16, 3, false).unwrap(),
            L2Entry::Zero {
                host: None,
                copied: false
            }
        );
        assert_eq!(
            decode_l2(normal_entry(0x50000), 16, 3, false).unwrap(),
            L2Entry::Normal {
                host: 0x50000,
                copied: true
            }
        );
        // v2 has no zero flag: an entry with it is refused, as in qemu.
        assert!(decode_l2(1, 16, 2, false)
            .unwrap_err()
            .contains("version 2"));
        assert!(decode_l2(normal_entry(0x50000) | 1, 16, 2, false).is_err());
        assert!(decode_l2(0x50200, 16, 3, false)
            .unwrap_err()
            .contains("aligned"));
        // Offset 0 with COPIED is a real cluster only in a data file.
        assert_eq!(
            decode_l2(OFLAG_COPIED, 16, 3, false).unwrap(),
            L2Entry::Unallocated
        );
        assert_eq!(
            decode_l2_in(OFLAG_COPIED, 16, 3, false, true).unwrap(),
            L2Entry::Normal {
                host: 0,
                copied: true
            }
        );
    }

    #[test]
    fn compressed_entries_decode_to_what_was_encoded() {
        for cb in [9u32, 12, 16, 21] {
            let cs = 1u64 << cb;
            // Compressed data is always shorter than a cluster.
            for (host, len) in [
                (cs, 1),
                (cs + 100, cs / 2),
                (3 * cs - 10, cs / 2 + 3),
                (5 * cs, cs - 1),
            ] {
                let raw = compressed_entry(host, len, cb);
                let Ok(L2Entry::Compressed(d)) = decode_l2(raw, cb, 3, false) else {
                    panic!("cb {cb}: {raw:#x} does not decode as compressed");
                };
                assert_eq!(d.host_offset, host);
                // The descriptor covers the data, up to its last sector's end.
                assert!(
                    d.max_len >= len && d.max_len - len < 512,
                    "cb {cb} {host} {len}"
                );
            }
        }
    }

    #[test]
    fn compressed_descriptor() {
        // cluster_bits 16: x = 54. offset 0x30210, 2 additional sectors.
        let raw = OFLAG_COMPRESSED | (2u64 << 54) | 0x30210;
        let L2Entry::Compressed(d) = decode_l2(raw, 16, 3, false).unwrap() else {
            panic!("not compressed")
        };
        assert_eq!(d.host_offset, 0x30210);
        assert_eq!(d.max_len, 3 * 512 - 0x10);
        assert_eq!(d.clusters(16), 3..=3);
        assert!(decode_l2(OFLAG_COMPRESSED, 16, 3, false).is_err());
    }

    #[test]
    fn subclusters() {
        let bm = 1u64 | (1 << 33);
        assert_eq!(subcluster_state(bm, 0).unwrap(), SubclusterState::Allocated);
        assert_eq!(subcluster_state(bm, 1).unwrap(), SubclusterState::Zero);
        assert_eq!(
            subcluster_state(bm, 2).unwrap(),
            SubclusterState::Unallocated
        );
        assert!(subcluster_state(1 | (1 << 32), 0).is_err());
    }

    #[test]
    fn l1_entries() {
        assert_eq!(decode_l1(0, 65536).unwrap(), None);
        assert_eq!(
            decode_l1(0x20000 | OFLAG_COPIED, 65536).unwrap(),
            Some((0x20000, true))
        );
        assert!(decode_l1(0x20200, 65536).is_err());
    }
}
