//! A request's memory as host address ranges, for building iovecs and
//! for the executor's own copies (zero fill, bounce buffers, inflated
//! clusters).
//!
//! [`HostSegments::fill`] translates an [`IoMemory`] once when the request
//! enters the in-flight table; the pointers stay valid because that table
//! owns the `IoMemory` (a guest-memory `Arc`, or an owned `Vec` or
//! `AlignedBuf` whose heap block never moves) until the request completes.

use crate::error::BlockError;
use crate::request::IoMemory;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// The largest iovec count one preadv/pwritev accepts (Linux's UIO_MAXIOV).
pub const IOV_MAX: usize = 1024;

/// Host address ranges of a request's memory, in request order.
#[derive(Debug, Default)]
pub struct HostSegments {
    segs: Vec<(*mut u8, usize)>,
    total: u64,
}

// SAFETY: the pointers refer to memory owned by the same in-flight entry
// (guest memory kept mapped by its `Arc`, or an owned heap buffer); moving
// the entry to another thread does not invalidate them.
unsafe impl Send for HostSegments {}

impl HostSegments {
    /// Translates `memory` into a new list (see [`HostSegments::fill`]).
    #[cfg(test)]
    pub fn of(memory: &mut IoMemory) -> Result<Self, BlockError> {
        let mut s = HostSegments::default();
        s.fill(memory)?;
        Ok(s)
    }

    /// Translates `memory`, reusing this list's storage. Guest segments
    /// were checked to lie in one region by [`IoMemory::guest`]; they are
    /// checked again here.
    pub fn fill(&mut self, memory: &mut IoMemory) -> Result<(), BlockError> {
        self.clear();
        let segs = &mut self.segs;
        let mut total = 0u64;
        match memory {
            IoMemory::None => {}
            IoMemory::Owned(v) => {
                if !v.is_empty() {
                    segs.push((v.as_mut_ptr(), v.len()));
                    total = v.len() as u64;
                }
            }
            IoMemory::Aligned(b) => {
                if !b.is_empty() {
                    segs.push((b.as_mut_slice().as_mut_ptr(), b.len()));
                    total = b.len() as u64;
                }
            }
            IoMemory::Guest { mem, segments } => {
                segs.reserve(segments.len());
                for seg in segments.iter() {
                    if seg.len == 0 {
                        continue;
                    }
                    let bad = || BlockError::BadGuestMemory {
                        addr: seg.addr.0,
                        len: seg.len,
                    };
                    let (region, addr) = mem.to_region_addr(seg.addr).ok_or_else(bad)?;
                    let slice = region
                        .get_slice(addr, seg.len as usize)
                        .map_err(|_| bad())?;
                    segs.push((slice.ptr_guard_mut().as_ptr(), seg.len as usize));
                    total += u64::from(seg.len);
                }
            }
        }
        self.total = total;
        Ok(())
    }

    /// Forgets every range, keeping the storage.
    pub fn clear(&mut self) {
        self.segs.clear();
        self.total = 0;
    }

    /// How many ranges the storage holds without growing.
    pub fn capacity(&self) -> usize {
        self.segs.capacity()
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Calls `f(ptr, len)` for each host range covering `off..off+len` of
    /// the request's memory (clamped to its end).
    fn for_range(&self, off: u64, len: u64, mut f: impl FnMut(*mut u8, usize)) {
        let mut skip = off;
        let mut left = len;
        for &(ptr, seg_len) in &self.segs {
            if left == 0 {
                break;
            }
            let seg_len64 = seg_len as u64;
            if skip >= seg_len64 {
                skip -= seg_len64;
                continue;
            }
            let take = (seg_len64 - skip).min(left);
            // `skip < seg_len`, so the offset stays inside the segment.
            f(ptr.wrapping_add(skip as usize), take as usize);
            left -= take;
            skip = 0;
        }
    }

    /// Appends iovecs covering `off..off+len` of the request's memory.
    pub fn iovecs(&self, off: u64, len: u64, out: &mut Vec<libc::iovec>) {
        self.for_range(off, len, |ptr, n| {
            out.push(libc::iovec {
                iov_base: ptr.cast(),
                iov_len: n,
            })
        });
    }

    /// Zeroes `off..off+len` of the request's memory.
    ///
    /// # Safety
    ///
    /// The memory must still be owned by the caller's in-flight entry, and
    /// no host operation may be accessing that range.
    pub unsafe fn fill_zero(&self, off: u64, len: u64) {
        self.for_range(off, len, |ptr, n| {
            // SAFETY: `ptr..ptr+n` lies inside one live segment (see `of`)
            // and the caller guarantees nothing else touches it.
            unsafe { std::ptr::write_bytes(ptr, 0, n) }
        });
    }

    /// Copies `src` into the request's memory at `off`.
    ///
    /// # Safety
    ///
    /// As for [`HostSegments::fill_zero`].
    pub unsafe fn copy_in(&self, off: u64, src: &[u8]) {
        let mut pos = 0usize;
        self.for_range(off, src.len() as u64, |ptr, n| {
            // SAFETY: `ptr..ptr+n` lies inside one live segment, `src` has
            // `n` bytes left at `pos`, and a request's memory never aliases
            // a buffer the executor owns.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(pos), ptr, n) };
            pos += n;
        });
    }

    /// Copies the request's memory at `off` into `dst`.
    ///
    /// # Safety
    ///
    /// The memory must still be owned by the caller's in-flight entry.
    pub unsafe fn copy_out(&self, off: u64, dst: &mut [u8]) {
        let mut pos = 0usize;
        self.for_range(off, dst.len() as u64, |ptr, n| {
            // SAFETY: as in `copy_in`, in the other direction.
            unsafe { std::ptr::copy_nonoverlapping(ptr, dst.as_mut_ptr().add(pos), n) };
            pos += n;
        });
    }
}

/// Whether each iovec's base is a multiple of `mem_align` and its length of
/// `len_align`.
pub fn iovecs_aligned(iov: &[libc::iovec], mem_align: usize, len_align: usize) -> bool {
    iov.iter().all(|v| {
        (v.iov_base as usize).is_multiple_of(mem_align) && v.iov_len.is_multiple_of(len_align)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::GuestSegment;
    use std::sync::Arc;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    #[test]
    fn guest_segments_split_into_iovecs_by_range() {
        let mem =
            Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 16)]).unwrap());
        let segs = vec![
            GuestSegment {
                addr: GuestAddress(0x1000),
                len: 100,
            },
            GuestSegment {
                addr: GuestAddress(0x3000),
                len: 0,
            },
            GuestSegment {
                addr: GuestAddress(0x2000),
                len: 50,
            },
        ];
        let mut io = IoMemory::guest(mem, segs).unwrap();
        let hs = HostSegments::of(&mut io).unwrap();
        assert_eq!(hs.len(), 150);
        let mut v = Vec::new();
        hs.iovecs(90, 30, &mut v);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].iov_len, v[1].iov_len), (10, 20));
        assert_eq!(
            v[1].iov_base as usize - v[0].iov_base as usize,
            0x2000 - 0x1000 - 90
        );
        // Clamped at the end.
        v.clear();
        hs.iovecs(140, 100, &mut v);
        assert_eq!(v.iter().map(|x| x.iov_len).sum::<usize>(), 10);
        // Copies land in the right places.
        // SAFETY: `io` is alive and no I/O uses it.
        unsafe { hs.copy_in(95, &[1, 2, 3, 4, 5, 6, 7]) };
        let mut back = [0u8; 7];
        // SAFETY: as above.
        unsafe { hs.copy_out(95, &mut back) };
        assert_eq!(back, [1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn unmapped_guest_memory_is_refused() {
        let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 4096)]).unwrap());
        let mut io = IoMemory::Guest {
            mem,
            segments: vec![GuestSegment {
                addr: GuestAddress(4000),
                len: 200,
            }],
        };
        assert!(matches!(
            HostSegments::of(&mut io),
            Err(BlockError::BadGuestMemory { .. })
        ));
    }
}
