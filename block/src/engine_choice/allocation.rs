//! Whether an opened image is fully allocated: no guest write can make
//! the file system allocate blocks. That is the condition under which
//! Linux AIO's `io_submit` does not block the submitting thread (a
//! write that makes the file system allocate blocks, or any I/O without
//! O_DIRECT, runs inside `io_submit`), so `engine=auto` asks it before
//! picking the `aio` engine, and an explicit `engine=aio` warns when it
//! does not hold.
//!
//! Enters as an opened [`Format`]; leaves as an [`Allocated`] summary
//! (how much of the guest's host space is fallocated but never written)
//! or the first reason the image is
//! sparse: a guest range with no host cluster (or one in the backing
//! chain, or compressed), or a host range without blocks in the file (a
//! hole; fallocated space counts as allocated).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

use crate::formats::{holes, Format};

/// At most this many block-status extents are looked at; a more
/// fragmented image is taken as sparse.
const EXTENT_BUDGET: usize = 1 << 20;

/// What a fully allocated image's host space is made of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allocated {
    /// Bytes of guest-visible host space in fallocated extents that were
    /// never written (FIEMAP's UNWRITTEN flag; 0 where the file system
    /// cannot say). The first write to each such block converts the
    /// extent inside the write call.
    pub unwritten: u64,
}

/// `Ok` when every guest range of `format` maps to host space that has
/// blocks in its file; else why not.
pub fn fully_allocated(format: &dyn Format) -> Result<Allocated, String> {
    let size = format.size();
    let mut offset = 0;
    let mut extents = 0;
    let mut unwritten = 0u64;
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
            .local()
            .get(usize::from(file.0))
            .ok_or("the image names a file it does not have")?;
        let Some(range_unwritten) = range_blocks(f, host, st.len)? else {
            return Err(format!(
                "the image file is sparse: host range {host}+{} (guest offset {offset}) has no blocks",
                st.len
            ));
        };
        unwritten = unwritten.saturating_add(range_unwritten);
        offset = offset.saturating_add(st.len);
    }
    Ok(Allocated { unwritten })
}

/// `Some(unwritten bytes)` when every byte of `start..start+len` of
/// `file` has a block (written or fallocated), `None` when some has not.
/// A block device always has, none of them unwritten as far as we know.
///
/// FIEMAP where the file system offers it (SEEK_HOLE cannot tell: ext4
/// and XFS report fallocated, unwritten extents as holes); else SEEK_HOLE
/// (tmpfs, which counts fallocated pages as data).
fn range_blocks(file: &File, start: u64, len: u64) -> Result<Option<u64>, String> {
    let md = file.metadata().map_err(|e| format!("fstat: {e}"))?;
    if md.file_type().is_block_device() {
        return Ok(Some(0));
    }
    let end = start.saturating_add(len).min(md.len());
    if start >= end {
        // Past the end of the file: a write there extends it.
        return Ok(None);
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
                Some((false, data_end)) => Ok((data_end >= end).then_some(0)),
                Some((true, _)) => Ok(None),
                None => Err("the file system reports neither FIEMAP nor SEEK_HOLE".into()),
            }
        }
        Err(e) => Err(format!("FIEMAP: {e}")),
    }
}

/// `FS_IOC_FIEMAP` (`_IOWR('f', 11, struct fiemap)`).
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_EXTENT_LAST: u32 = 1;
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
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

/// Up to [`FIEMAP_BATCH`] extents of `file` from `start` to `end`.
fn fiemap(file: &File, start: u64, end: u64) -> std::io::Result<Fiemap> {
    let mut map = Fiemap {
        start,
        length: end.saturating_sub(start),
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
    Ok(map)
}

/// `Some(bytes of start..end in unwritten extents)` when the file's
/// extents cover `start..end` without a gap, else `None`.
fn fiemap_covers(file: &File, start: u64, end: u64) -> std::io::Result<Option<u64>> {
    let mut pos = start;
    let mut unwritten = 0u64;
    while pos < end {
        let map = fiemap(file, pos, end)?;
        let n = (map.mapped_extents as usize).min(FIEMAP_BATCH);
        if n == 0 {
            return Ok(None);
        }
        for ext in &map.extents[..n] {
            if ext.logical > pos {
                return Ok(None);
            }
            let ext_end = ext.logical.saturating_add(ext.length);
            if ext.flags & FIEMAP_EXTENT_UNWRITTEN != 0 && ext_end > pos {
                unwritten = unwritten.saturating_add(ext_end.min(end) - pos);
            }
            pos = pos.max(ext_end);
            if pos >= end {
                return Ok(Some(unwritten));
            }
            if ext.flags & FIEMAP_EXTENT_LAST != 0 {
                return Ok(None);
            }
        }
    }
    Ok(Some(unwritten))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{DiskOptions, ImageType};

    fn raw(
        dir: &std::path::Path,
        name: &str,
        write: impl FnOnce(&File),
    ) -> Result<Allocated, String> {
        let path = dir.join(name);
        let f = File::create(&path).unwrap();
        write(&f);
        drop(f);
        let mut o = DiskOptions::new(&path);
        o.image_type = ImageType::RAW;
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
        assert_eq!(full, Ok(Allocated { unwritten: 0 }));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Fallocated blocks count as allocated, and FIEMAP tells how many are
    /// still unwritten (where the file system has FIEMAP: ext4 and XFS do,
    /// tmpfs does not and reports 0).
    #[test]
    fn fallocated_blocks_are_allocated_and_counted_while_unwritten() {
        use std::os::unix::fs::FileExt;
        let dir = std::env::temp_dir().join(format!("alloc-unit-falloc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mib = 1u64 << 20;
        let probe = |f: &File| {
            // SAFETY: plain fallocate on a file we own.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, mib as libc::off_t) };
            assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
        };
        // ext4 and XFS report unwritten extents; other file systems may not.
        let fiemap = {
            let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a zeroed statfs filled by the call; `c` is a valid path.
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
            matches!(st.f_type as i64, 0xEF53 | 0x5846_5342)
        };
        let fresh = raw(&dir, "falloc", probe).unwrap();
        assert_eq!(fresh.unwritten, if fiemap { mib } else { 0 });
        let half = raw(&dir, "half", |f| {
            probe(f);
            f.write_all_at(&vec![7u8; (mib / 2) as usize], 0).unwrap();
            f.sync_all().unwrap();
        })
        .unwrap();
        assert_eq!(half.unwritten, if fiemap { mib / 2 } else { 0 });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
