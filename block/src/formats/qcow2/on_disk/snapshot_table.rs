//! The internal snapshot table: parsing its entries for `info`,
//! `snapshot -l` and `check`.
//!
//! Where the table is ([`TableLocation`], from the header or as snapshot
//! operations moved it) and the file enter;
//! the entries leave, or a reason when the table is not where the header
//! says or does not fit. Entry layout (qcow2 spec): L1 offset (8), L1 size
//! (4), id length (2), name length (2), date seconds (4), date
//! nanoseconds (4), VM clock in ns (8), VM state size (4), extra data size
//! (4), the extra data (optionally: 64-bit VM state size, virtual disk
//! size, instruction count), the id, the name, padding to 8 bytes.

use super::header::Header;
use crate::formats::qcow2::metadata::meta_io::{read_at, MetaIo, MetaKind};

/// qemu's limits: more snapshots, a larger table, or more extra data per
/// entry are refused.
pub(crate) const MAX_SNAPSHOTS: u32 = 65536;
pub(crate) const MAX_SNAPSHOT_TABLE: u64 = 64 << 20;
pub(crate) const MAX_EXTRA_DATA: u64 = 1024;

/// One snapshot as the table describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub id: String,
    pub name: String,
    pub l1_offset: u64,
    pub l1_size: u32,
    pub date_sec: u32,
    pub date_nsec: u32,
    pub vm_clock_nsec: u64,
    pub vm_state_size: u64,
    /// Virtual disk size at the snapshot, when recorded.
    pub disk_size: Option<u64>,
    /// Instruction count at the snapshot, when recorded (not -1).
    pub icount: Option<u64>,
}

/// Where the snapshot table is: the header's `nb_snapshots` and
/// `snapshots_offset`. An open image keeps it in `MetaState`, so snapshot
/// operations that move the table are seen by the rest of the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TableLocation {
    pub count: u32,
    pub offset: u64,
}

impl TableLocation {
    pub fn of(h: &Header) -> Self {
        TableLocation {
            count: h.nb_snapshots,
            offset: h.snapshots_offset,
        }
    }
}

/// The entries of the table and the table's length in bytes, or why the
/// table cannot be read, in qemu's words where qemu has them (an image
/// open refuses such a table, as qemu does; `check` reports it). What is
/// read is bounded by the file: every entry must lie inside it.
pub(crate) fn read_snapshot_table(
    file: &dyn MetaIo,
    at: TableLocation,
    file_size: u64,
) -> Result<(Vec<SnapshotInfo>, u64), String> {
    if at.count == 0 {
        return Ok((Vec::new(), 0));
    }
    if at.count > MAX_SNAPSHOTS {
        return Err("Snapshot table too large".into());
    }
    let read = |pos: u64, buf: &mut [u8], n: u32| -> Result<(), String> {
        let end = pos.checked_add(buf.len() as u64);
        if end.is_some_and(|e| e - at.offset > MAX_SNAPSHOT_TABLE) {
            return Err("Snapshot table is too big".into());
        }
        if end.is_none_or(|e| e > file_size) {
            return Err(format!("snapshot table entry {n} lies outside the image"));
        }
        read_at(file, MetaKind::SnapshotTable, pos, buf)
            .map_err(|e| format!("Failed to read snapshot table: {e}"))
    };
    let mut pos = at.offset;
    let mut out = Vec::new();
    for n in 0..at.count {
        let mut fixed = [0u8; 40];
        read(pos, &mut fixed, n)?;
        let be16 = |i: usize| u16::from_be_bytes([fixed[i], fixed[i + 1]]) as u64;
        let be32 =
            |i: usize| u32::from_be_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]);
        let be64 = |b: &[u8], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(w)
        };
        let (id_len, name_len) = (be16(12), be16(14));
        let extra_len = u64::from(be32(36));
        if extra_len > MAX_EXTRA_DATA {
            return Err(format!(
                "Too much extra metadata in snapshot table entry {n}"
            ));
        }
        // At most 1024 + 2 x 65535 bytes, and read() checks them against
        // the file before anything is trusted.
        let mut rest = vec![0u8; (extra_len + id_len + name_len) as usize];
        read(pos + 40, &mut rest, n)?;
        let extra = &rest[..extra_len as usize];
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let id = text(&rest[extra_len as usize..(extra_len + id_len) as usize]);
        let name = text(&rest[(extra_len + id_len) as usize..]);
        out.push(SnapshotInfo {
            id,
            name,
            l1_offset: be64(&fixed, 0),
            l1_size: be32(8),
            date_sec: be32(16),
            date_nsec: be32(20),
            vm_clock_nsec: be64(&fixed, 24),
            vm_state_size: if extra.len() >= 8 {
                be64(extra, 0)
            } else {
                u64::from(be32(32))
            },
            disk_size: (extra.len() >= 16).then(|| be64(extra, 8)),
            icount: (extra.len() >= 24)
                .then(|| be64(extra, 16))
                .filter(|&c| c != u64::MAX),
        });
        pos += (40 + extra_len + id_len + name_len).div_ceil(8) * 8;
    }
    Ok((out, pos - at.offset))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    /// A header naming a one-entry table at `off` in a file holding `bytes`.
    fn table_file(entry: &[u8]) -> (File, Header, u64, std::path::PathBuf) {
        let path =
            std::env::temp_dir().join(format!("snaptable-{}-{}", std::process::id(), entry.len()));
        let mut data = vec![0u8; 4096];
        data.extend_from_slice(entry);
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let h = Header {
            version: 3,
            backing_file_offset: 0,
            backing_file_size: 0,
            cluster_bits: 12,
            size: 1 << 20,
            crypt_method: 0,
            l1_size: 1,
            l1_table_offset: 4096,
            refcount_table_offset: 4096,
            refcount_table_clusters: 1,
            nb_snapshots: 1,
            snapshots_offset: 4096,
            incompatible: 0,
            compatible: 0,
            autoclear: 0,
            refcount_order: 4,
            header_length: super::super::header::V3_HEADER_LEN,
            compression: crate::formats::Compression::Deflate,
            backing_file: None,
            backing_format: None,
            data_file: None,
            bitmaps: None,
        };
        (file, h, data.len() as u64, path)
    }

    fn entry(extra_len: u32, id: &[u8], name: &[u8]) -> Vec<u8> {
        let mut e = vec![0u8; 40];
        e[12..14].copy_from_slice(&(id.len() as u16).to_be_bytes());
        e[14..16].copy_from_slice(&(name.len() as u16).to_be_bytes());
        e[36..40].copy_from_slice(&extra_len.to_be_bytes());
        e.extend(std::iter::repeat_n(0u8, extra_len.min(4096) as usize));
        e.extend_from_slice(id);
        e.extend_from_slice(name);
        e
    }

    #[test]
    fn parses_an_entry() {
        let (file, h, len, path) = table_file(&entry(24, b"7", b"seven"));
        let (entries, table_len) = read_snapshot_table(&file, TableLocation::of(&h), len).unwrap();
        std::fs::remove_file(path).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(
            (entries[0].id.as_str(), entries[0].name.as_str()),
            ("7", "seven")
        );
        assert_eq!(entries[0].disk_size, Some(0));
        assert_eq!(table_len, (40 + 24 + 1 + 5u64).div_ceil(8) * 8);
    }

    /// Hostile sizes are refused before any buffer is sized by them.
    #[test]
    fn refuses_huge_extra_data_and_entries_past_the_file() {
        let (file, h, len, path) = table_file(&entry(u32::MAX, b"1", b"x"));
        let err = read_snapshot_table(&file, TableLocation::of(&h), len).unwrap_err();
        assert!(err.contains("Too much extra metadata"), "{err}");
        std::fs::remove_file(path).unwrap();
        let mut e = entry(0, b"1", b"x");
        e[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
        let (file, h, len, path) = table_file(&e);
        let err = read_snapshot_table(&file, TableLocation::of(&h), len).unwrap_err();
        assert!(err.contains("outside the image"), "{err}");
        std::fs::remove_file(path).unwrap();
    }
}
