//! A request's memory as the NBD connection sees it: the addresses and
//! lengths of an op's iovecs, copied at push time, and the copies in and
//! out of them.
//!
//! The addresses are kept as integers so the list can travel to the
//! connection's thread; every access is an `unsafe fn` whose caller
//! promises what [`crate::Engine::push`]'s caller promised: the
//! memory is alive and not otherwise used until the op's completion has
//! been reaped. The connection keeps that promise by copying only while
//! the op is in its table, under the table's lock, and by completing the
//! op only after the last copy.

use crate::RawIovecs;

#[derive(Debug, Default)]
pub(crate) struct IovList {
    /// (address, length) of each piece, in order.
    parts: Vec<(usize, usize)>,
}

impl IovList {
    pub fn empty() -> Self {
        IovList::default()
    }

    /// Copies the iovec array of `iov`.
    ///
    /// # Safety
    ///
    /// `iov.ptr` must point at `iov.count` valid iovecs.
    pub unsafe fn from_raw(iov: &RawIovecs) -> Self {
        let mut parts = Vec::with_capacity(iov.count as usize);
        for i in 0..iov.count as usize {
            // SAFETY: the caller promises `count` readable iovecs.
            let v = unsafe { *iov.ptr.add(i) };
            parts.push((v.iov_base as usize, v.iov_len));
        }
        IovList { parts }
    }

    pub fn len(&self) -> u64 {
        self.parts.iter().map(|p| p.1 as u64).sum()
    }

    /// Calls `f(address, len)` for the bytes `at..at+len` of the list.
    fn walk(&self, mut at: u64, mut len: usize, mut f: impl FnMut(usize, usize, usize)) {
        let mut done = 0;
        for &(base, plen) in &self.parts {
            if len == 0 {
                break;
            }
            let plen = plen as u64;
            if at >= plen {
                at -= plen;
                continue;
            }
            let n = ((plen - at) as usize).min(len);
            f(base + at as usize, n, done);
            done += n;
            len -= n;
            at = 0;
        }
    }

    /// Copies `src` into the list at byte `at` (bytes past the end are
    /// dropped).
    ///
    /// # Safety
    ///
    /// The memory the list names must be alive and writable, and not used
    /// by anyone else for the duration of the call.
    pub unsafe fn copy_in(&self, at: u64, src: &[u8]) {
        self.walk(at, src.len(), |addr, n, done| {
            // SAFETY: the caller promises the list's memory is writable
            // and unused; `addr..addr+n` lies inside one of its pieces.
            unsafe { std::ptr::copy_nonoverlapping(src[done..].as_ptr(), addr as *mut u8, n) };
        });
    }

    /// Zeroes `len` bytes of the list at byte `at`.
    ///
    /// # Safety
    ///
    /// As [`IovList::copy_in`].
    pub unsafe fn zero(&self, at: u64, len: usize) {
        self.walk(at, len, |addr, n, _| {
            // SAFETY: as in `copy_in`.
            unsafe { std::ptr::write_bytes(addr as *mut u8, 0, n) };
        });
    }

    /// Copies `len` bytes of the list at byte `at` into a new buffer.
    ///
    /// # Safety
    ///
    /// The memory the list names must be alive and readable.
    pub unsafe fn copy_out(&self, at: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.walk(at, len, |addr, n, done| {
            // SAFETY: the caller promises the memory is readable;
            // `addr..addr+n` lies inside one of the list's pieces.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, out[done..].as_mut_ptr(), n)
            };
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_cross_piece_boundaries() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 5];
        let iov = [
            libc::iovec {
                iov_base: a.as_mut_ptr().cast(),
                iov_len: a.len(),
            },
            libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            },
        ];
        let raw = RawIovecs {
            ptr: iov.as_ptr(),
            count: 2,
        };
        // SAFETY: `a` and `b` outlive the list and nothing else uses them.
        unsafe {
            let l = IovList::from_raw(&raw);
            assert_eq!(l.len(), 8);
            l.copy_in(2, b"wxyz");
            l.zero(5, 1);
            assert_eq!(l.copy_out(1, 6), b"\0wxy\0\0");
        }
        assert_eq!((a, b), ([0, 0, b'w'], [b'x', b'y', 0, 0, 0]));
    }
}
