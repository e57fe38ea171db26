//! Where a host file ends, and where it has holes (SEEK_DATA /
//! SEEK_HOLE, for `map`), with [`DataExtentCache`] remembering the last
//! data run found so a walk that asks about one run many times (convert
//! asks per chunk, for read-ahead and again to read) does not pay two
//! `lseek`s each time.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::Mutex;

/// How long a host file is: its length, or for a block device (whose
/// metadata says 0) the offset of its end.
pub fn file_size(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.file_type().is_file() {
        return Ok(meta.len());
    }
    let mut f = file;
    f.seek(SeekFrom::End(0))
}

/// Whether `offset` of `file` lies in a hole, and where that hole (or the
/// data run) ends. `None` when the file system cannot say; callers then
/// count the range as data.
pub fn extent_at(file: &File, offset: u64) -> Option<(bool, u64)> {
    let fd = file.as_raw_fd();
    let off = libc::off_t::try_from(offset).ok()?;
    // SAFETY: lseek on a descriptor `file` keeps open; it only moves the
    // file position, which none of our I/O uses (all of it is positional).
    let data = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
    if data < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            // No data at or after `offset`: a hole up to the end.
            Some(libc::ENXIO) => Some((true, u64::MAX)),
            _ => None,
        };
    }
    if data > off {
        return Some((true, data as u64));
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, off, libc::SEEK_HOLE) };
    (hole > off).then_some((false, hole as u64))
}

/// The last data run [`extent_at`] found in one file. Only data is
/// remembered, never a hole: a hole the file fills later would hide
/// data, while data the file later punches out only reads as the zeroes
/// it now holds (the same choice as QEMU's block-status cache).
#[derive(Debug, Default)]
pub struct DataExtentCache {
    run: Mutex<Option<(u64, u64)>>,
}

impl DataExtentCache {
    /// [`extent_at`], answered from the remembered data run when
    /// `offset` lies inside it.
    pub fn extent_at(&self, file: &File, offset: u64) -> Option<(bool, u64)> {
        let cached = *self.run.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((start, end)) = cached {
            if start <= offset && offset < end {
                return Some((false, end));
            }
        }
        let answer = extent_at(file, offset);
        if let Some((false, end)) = answer {
            *self.run.lock().unwrap_or_else(|e| e.into_inner()) = Some((offset, end));
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// A 4 MiB sparse file in the temp folder with 64 KiB of data at 1
    /// MiB; removed by the caller.
    fn sparse_file(name: &str) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(4 << 20).unwrap();
        file.write_all_at(&[1u8; 65536], 1 << 20).unwrap();
        (path, file)
    }

    #[test]
    fn finds_data_between_holes() {
        let (path, file) = sparse_file("holes");
        let at_start = extent_at(&file, 0);
        let in_data = extent_at(&file, 1 << 20);
        std::fs::remove_file(&path).unwrap();
        // File systems without hole tracking report everything as data.
        if let Some((hole, end)) = at_start {
            if hole {
                assert_eq!(end, 1 << 20);
                assert_eq!(in_data, Some((false, (1 << 20) + 65536)));
            }
        }
    }

    #[test]
    fn the_cache_keeps_data_runs_but_not_holes() {
        let (path, file) = sparse_file("holes-cache");
        let cache = DataExtentCache::default();
        let first = cache.extent_at(&file, 1 << 20);
        let hole_before = cache.extent_at(&file, 0);
        // The hole at 2 MiB fills: a remembered hole would hide this.
        file.write_all_at(&[2u8; 65536], 2 << 20).unwrap();
        let filled = cache.extent_at(&file, 2 << 20);
        // Inside the remembered run: the same end, from the cache.
        let inside = cache.extent_at(&file, (1 << 20) + 4096);
        std::fs::remove_file(&path).unwrap();
        if hole_before == Some((true, 1 << 20)) {
            assert_eq!(first, Some((false, (1 << 20) + 65536)));
            assert_eq!(filled, Some((false, (2 << 20) + 65536)));
            assert_eq!(inside, Some((false, (1 << 20) + 65536)));
        }
    }
}
