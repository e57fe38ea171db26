//! Whether an opened image is fully allocated: no guest write can make
//! the file system allocate blocks. That is the condition under which
//! Linux AIO's `io_submit` does not block the submitting thread
//! (REFERENCE.md section 4), so `engine=auto` asks it before picking the
//! `aio` engine, and an explicit `engine=aio` warns when it does not hold.
//!
//! Enters as an opened [`Format`]; leaves as `Ok(())` or the first reason
//! the image is sparse: a guest range with no host cluster (or one in the
//! backing chain, or compressed), or a host range without blocks in the
//! file (a hole; fallocated space counts as allocated).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

use crate::formats::{holes, Format};

/// At most this many block-status extents are looked at; a more
/// fragmented image is taken as sparse.
const EXTENT_BUDGET: usize = 1 << 20;

/// `Ok(())` when every guest range of `format` maps to host space that
/// has blocks in its file; else why not.
pub fn fully_allocated(format: &dyn Format) -> Result<(), String> {
    let size = format.size();
    let mut offset = 0;
    let mut extents = 0;
    while offset < size {
        extents += 1;
        if extents > EXTENT_BUDGET {
            return Err(format!(
                "more than {EXTENT_BUDGET} extents: too fragmented to tell"
            ));
        }
        let st = format
            .block_status(offset, size - offset)
            .map_err(|e| format!("block status at {offset}: {e}"))?;
        let (Some(host), Some(file)) = (st.offset, st.file) else {
            return Err(format!(
                "guest offset {offset} has no host cluster in the image (a write allocates)"
            ));
        };
        if st.depth > 0 || !st.present {
            return Err(format!(
                "guest offset {offset} reads from the backing chain (a write allocates)"
            ));
        }
        if st.compressed {
            return Err(format!(
                "guest offset {offset} is a compressed cluster (a write allocates)"
            ));
        }
        if st.len == 0 {
            return Err(format!("block status made no progress at {offset}"));
        }
        let f = format
            .files()
            .get(usize::from(file.0))
            .ok_or("the image names a file it does not have")?;
        if !range_has_blocks(f, host, st.len)? {
            return Err(format!(
                "the image file is sparse: host range {host}+{} (guest offset {offset}) has no blocks",
                st.len
            ));
        }
        offset = offset.saturating_add(st.len);
    }
    Ok(())
}

/// Whether every byte of `start..start+len` of `file` has a block
/// (written or fallocated). A block device always has.
///
/// FIEMAP where the file system offers it (SEEK_HOLE cannot tell: ext4
/// and XFS report fallocated, unwritten extents as holes); else SEEK_HOLE
/// (tmpfs, which counts fallocated pages as data).
fn range_has_blocks(file: &File, start: u64, len: u64) -> Result<bool, String> {
    let md = file.metadata().map_err(|e| format!("fstat: {e}"))?;
    if md.file_type().is_block_device() {
        return Ok(true);
    }
    let end = start.saturating_add(len).min(md.len());
    if start >= end {
        // Past the end of the file: a write there extends it.
        return Ok(false);
    }
    match fiemap_covers(file, start, end) {
        Ok(covered) => Ok(covered),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY)
            ) =>
        {
            match holes::extent_at(file, start) {
                Some((false, data_end)) => Ok(data_end >= end),
                Some((true, _)) => Ok(false),
                None => Err("the file system reports neither FIEMAP nor SEEK_HOLE".into()),
            }
        }
        Err(e) => Err(format!("FIEMAP: {e}")),
    }
}

/// `FS_IOC_FIEMAP` (`_IOWR('f', 11, struct fiemap)`).
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_EXTENT_LAST: u32 = 1;
/// Extents read per ioctl.
const FIEMAP_BATCH: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

#[repr(C)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; FIEMAP_BATCH],
}

/// Whether the file's extents cover `start..end` without a gap.
fn fiemap_covers(file: &File, start: u64, end: u64) -> std::io::Result<bool> {
    let mut pos = start;
    while pos < end {
        let mut map = Fiemap {
            start: pos,
            length: end - pos,
            flags: 0,
            mapped_extents: 0,
            extent_count: FIEMAP_BATCH as u32,
            reserved: 0,
            extents: [FiemapExtent::default(); FIEMAP_BATCH],
        };
        // SAFETY: `map` is a `struct fiemap` with room for `extent_count`
        // extents, as the ioctl expects; it lives across the call.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP as _, &mut map) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = (map.mapped_extents as usize).min(FIEMAP_BATCH);
        if n == 0 {
            return Ok(false);
        }
        for ext in &map.extents[..n] {
            if ext.logical > pos {
                return Ok(false);
            }
            pos = pos.max(ext.logical.saturating_add(ext.length));
            if pos >= end {
                return Ok(true);
            }
            if ext.flags & FIEMAP_EXTENT_LAST != 0 {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{DiskOptions, ImageType};

    fn raw(dir: &std::path::Path, name: &str, write: impl FnOnce(&File)) -> Result<(), String> {
        let path = dir.join(name);
        let f = File::create(&path).unwrap();
        write(&f);
        drop(f);
        let mut o = DiskOptions::new(&path);
        o.image_type = ImageType::Raw;
        o.lock = false;
        let format = crate::formats::open_format(&o).unwrap();
        fully_allocated(format.as_ref())
    }

    #[test]
    fn raw_files_with_and_without_holes() {
        let dir = std::env::temp_dir().join(format!("alloc-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sparse = raw(&dir, "sparse", |f| f.set_len(1 << 20).unwrap());
        assert!(sparse.unwrap_err().contains("sparse"));
        let full = raw(&dir, "full", |f| {
            use std::io::Write;
            let mut f = f;
            f.write_all(&vec![1u8; 1 << 20]).unwrap();
            f.sync_all().unwrap();
        });
        assert_eq!(full, Ok(()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
