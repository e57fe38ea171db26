//! The bitmaps header extension: where the persistent bitmaps'
//! directory is, checked as qemu checks it while it reads the header
//! (`qcow2_read_extensions`): the extension's length, and while the
//! "bitmaps" autoclear bit says the bitmaps are consistent, the count,
//! the directory's alignment and size.
//!
//! The extension's bytes enter [`parse_extension`] from the header
//! parser; a [`BitmapsExtension`] (or `None`, or qemu's words for what is
//! wrong) leaves. The directory itself is read by `bitmap_directory`.

use crate::formats::qcow2::metadata::meta_io::be64_at;

/// The bitmaps header extension's type.
pub const EXT_BITMAPS: u32 = 0x2385_2875;
/// qemu's limits for the bitmaps extension.
pub const MAX_BITMAPS: u32 = 65535;
pub const MAX_DIRECTORY: u64 = 1024 * MAX_BITMAPS as u64;
/// Where the directory is, from a consistent bitmaps extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BitmapsExtension {
    pub count: u32,
    pub dir_size: u64,
    pub dir_offset: u64,
}

/// The bitmaps extension's bytes, checked as qemu checks them while it
/// reads the header; `consistent`: the "bitmaps" autoclear bit is set
/// (without it qemu ignores the extension, as we do: `None`).
pub(crate) fn parse_extension(
    bytes: &[u8],
    consistent: bool,
    cluster_size: u64,
) -> Result<Option<BitmapsExtension>, String> {
    if bytes.len() != 24 {
        return Err("bitmaps_ext: Invalid extension length".into());
    }
    if !consistent {
        return Ok(None);
    }
    let (count, reserved) = (be32(bytes, 0), be32(bytes, 4));
    let (dir_size, dir_offset) = (be64_at(bytes, 1), be64_at(bytes, 2));
    if reserved != 0 {
        return Err("bitmaps_ext: Reserved field is not zero".into());
    }
    if count > MAX_BITMAPS {
        return Err(format!(
            "bitmaps_ext: Image has {count} bitmaps, exceeding the QEMU supported maximum of {MAX_BITMAPS}"
        ));
    }
    if count == 0 {
        return Err("found bitmaps extension with zero bitmaps".into());
    }
    if !dir_offset.is_multiple_of(cluster_size) {
        return Err("bitmaps_ext: invalid bitmap directory offset".into());
    }
    if dir_size > MAX_DIRECTORY {
        return Err(format!(
            "bitmaps_ext: bitmap directory size ({dir_size}) exceeds the maximum supported size ({MAX_DIRECTORY})"
        ));
    }
    Ok(Some(BitmapsExtension {
        count,
        dir_size,
        dir_offset,
    }))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = 65536;

    #[test]
    fn the_extension_is_refused_as_qemu_refuses_it() {
        let ext = |count: u32, reserved: u32, size: u64, offset: u64| {
            let mut b = Vec::new();
            b.extend_from_slice(&count.to_be_bytes());
            b.extend_from_slice(&reserved.to_be_bytes());
            b.extend_from_slice(&size.to_be_bytes());
            b.extend_from_slice(&offset.to_be_bytes());
            b
        };
        let ok = parse_extension(&ext(1, 0, 32, CS), true, CS).unwrap();
        assert_eq!(ok.map(|e| e.dir_offset), Some(CS));
        assert_eq!(parse_extension(&ext(70000, 0, 32, CS), false, CS), Ok(None));
        let err = |b: &[u8]| parse_extension(b, true, CS).unwrap_err();
        assert!(err(&ext(70000, 0, 32, CS)).contains("70000 bitmaps"));
        assert!(err(&ext(0, 0, 32, CS)).contains("zero bitmaps"));
        assert!(err(&ext(1, 1, 32, CS)).contains("Reserved"));
        assert!(err(&ext(1, 0, 32, CS + 8)).contains("directory offset"));
        assert!(err(&ext(1, 0, 1 << 62, CS)).contains("exceeds the maximum"));
        assert!(err(&ext(1, 0, 32, CS)[..16]).contains("extension length"));
    }
}
