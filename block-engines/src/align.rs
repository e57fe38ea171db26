//! O_DIRECT alignment: what a file needs.
//!
//! [`file_alignment`] asks the kernel (statx `STATX_DIOALIGN`), then the
//! block device (`BLKSSZGET`), then probes with reads of 512 and 4096
//! bytes. Buffers with that alignment are [`crate::aligned::AlignedBuf`];
//! the executor reads or writes through them when a request's offset,
//! length or memory is not aligned.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

use crate::aligned::AlignedBuf;

/// What O_DIRECT needs of one file's I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DioAlign {
    /// Alignment of memory addresses.
    pub mem: u32,
    /// Alignment of file offsets and lengths (the logical block size).
    pub offset: u32,
}

impl DioAlign {
    /// No constraint (buffered I/O).
    pub const NONE: DioAlign = DioAlign { mem: 1, offset: 1 };

    /// The stricter of two constraints.
    pub fn max(self, other: DioAlign) -> DioAlign {
        DioAlign {
            mem: self.mem.max(other.mem),
            offset: self.offset.max(other.offset),
        }
    }

    pub fn is_none(&self) -> bool {
        self.mem <= 1 && self.offset <= 1
    }
}

/// Whether `file` was opened with O_DIRECT.
pub fn is_direct(file: &File) -> bool {
    // SAFETY: F_GETFL on a descriptor we own; no memory is passed.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_DIRECT != 0
}

/// The alignment I/O on `file` must respect ([`DioAlign::NONE`] unless it
/// was opened with O_DIRECT).
pub fn file_alignment(file: &File) -> DioAlign {
    if !is_direct(file) {
        return DioAlign::NONE;
    }
    statx_dioalign(file)
        .or_else(|| blksszget(file))
        .unwrap_or_else(|| probe_alignment(file))
}

fn statx_dioalign(file: &File) -> Option<DioAlign> {
    // SAFETY: an all-zero statx is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `stx` is a valid, writable statx; the empty path with
    // AT_EMPTY_PATH names the descriptor itself.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if r != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    let (mem, offset) = (stx.stx_dio_mem_align, stx.stx_dio_offset_align);
    // 0 means "O_DIRECT not supported here"; let the other methods decide.
    (mem.is_power_of_two() && offset.is_power_of_two() && offset <= 1 << 16 && mem <= 1 << 16)
        .then_some(DioAlign { mem, offset })
}

fn blksszget(file: &File) -> Option<DioAlign> {
    let is_blk = file.metadata().ok()?.file_type().is_block_device();
    if !is_blk {
        return None;
    }
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one c_int to the pointer we pass.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut size) };
    let size = u32::try_from(size).ok()?;
    (r == 0 && size.is_power_of_two() && size >= 512).then_some(DioAlign {
        mem: size,
        offset: size,
    })
}

/// Tries an O_DIRECT read of 512 bytes, then 4096; EINVAL means "too small".
fn probe_alignment(file: &File) -> DioAlign {
    use std::os::unix::fs::FileExt;
    for size in [512u32, 4096] {
        let Some(mut buf) = AlignedBuf::new(size as usize, size as usize) else {
            break;
        };
        match file.read_at(buf.as_mut_slice(), 0) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => continue,
            _ => {
                return DioAlign {
                    mem: size,
                    offset: size,
                }
            }
        }
    }
    DioAlign {
        mem: 4096,
        offset: 4096,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffered_file_needs_no_alignment() {
        let f = File::open("/proc/self/exe").unwrap();
        assert_eq!(file_alignment(&f), DioAlign::NONE);
    }
}
