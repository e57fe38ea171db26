//! The crate's one aligned heap buffer: owned request memory that must go
//! straight to an O_DIRECT file, the executor's bounce and compressed-read
//! buffers, the shared zero page and the tools' direct-I/O buffers.
//!
//! `Vec<u8>` cannot promise more than byte alignment; this type allocates
//! with the `Layout` it is asked for and frees with the same one, or, for
//! long-lived buffers that may stay partly unused
//! ([`AlignedBuf::new_mapped`]), maps pages of their own, which take
//! memory only once touched.
//!
//! Length rule: a buffer is exactly as long as asked ([`AlignedBuf::len`]
//! is the `len` given to [`AlignedBuf::new`]), never rounded up. Callers
//! that need whole O_DIRECT blocks ask for a multiple of the block size.
//!
//! A window ([`AlignedBuf::set_window`]) shows only part of the buffer:
//! `len`, the slices and `as_ptr` (so the I/O of a request that owns the
//! buffer) cover just that part, until [`AlignedBuf::full_window`]. A
//! tool writes a part of a buffer it read so, without copying it out.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// `len` zero-initialised bytes at an address that is a multiple of the
/// requested alignment.
pub struct AlignedBuf {
    /// The allocation's first byte.
    ptr: NonNull<u8>,
    /// The window: `start..start + len` of the allocation.
    start: usize,
    len: usize,
    /// The `len` asked for at allocation.
    capacity: usize,
    /// How it was allocated, and so how it is freed.
    alloc: Alloc,
}

/// Where an [`AlignedBuf`]'s memory comes from.
enum Alloc {
    /// The global allocator, with this layout (at least one byte, so never
    /// a zero-size layout).
    Heap(Layout),
    /// An anonymous mapping of this many bytes (at least one).
    Mapped(usize),
}

// SAFETY: the buffer is uniquely owned heap memory, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes aligned to `align` (a power of two). `None` when
    /// the layout is invalid or memory is exhausted.
    pub fn new(len: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(1), align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(AlignedBuf {
            ptr,
            start: 0,
            len,
            capacity: len,
            alloc: Alloc::Heap(layout),
        })
    }

    /// `len` zero bytes on pages of their own (so page-aligned), which
    /// take memory only once touched: for long-lived buffers that may
    /// stay partly unused (ch-img convert's chunk pool). Each costs an
    /// mmap and a munmap, and its pages fault in on first touch, so
    /// per-request buffers use [`AlignedBuf::new`]. `None` when the
    /// mapping fails.
    pub fn new_mapped(len: usize) -> Option<Self> {
        let size = len.max(1);
        // SAFETY: a new anonymous private mapping (no address hint, no
        // file); it aliases nothing, and the kernel fills it with zeroes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(AlignedBuf {
            ptr: NonNull::new(p.cast())?,
            start: 0,
            len,
            capacity: len,
            alloc: Alloc::Mapped(size),
        })
    }

    /// The bytes the window shows (all of them unless narrowed).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes allocated (the `len` asked for).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Shows only `range` of the allocation; false (and no change) when
    /// it does not lie inside it.
    pub fn set_window(&mut self, range: std::ops::Range<usize>) -> bool {
        if range.start > range.end || range.end > self.capacity {
            return false;
        }
        self.start = range.start;
        self.len = range.end - range.start;
        true
    }

    /// Shows the whole allocation again.
    pub fn full_window(&mut self) {
        self.start = 0;
        self.len = self.capacity;
    }

    /// The window's first byte.
    fn window_ptr(&self) -> *mut u8 {
        // `start <= capacity` (set_window), inside or one past the
        // allocation.
        self.ptr.as_ptr().wrapping_add(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, for iovecs the kernel fills or reads. Writing
    /// through it is only sound while nothing else borrows the buffer
    /// (the executor's ops own theirs until they are reaped).
    pub fn as_ptr(&self) -> *mut u8 {
        self.window_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the window `start..start + len` lies inside the
        // allocation's `capacity` initialised bytes owned by `self`,
        // borrowed immutably for the returned lifetime.
        unsafe { std::slice::from_raw_parts(self.window_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.window_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.alloc {
            // SAFETY: allocated in `new` with exactly this layout.
            Alloc::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr(), layout) },
            Alloc::Mapped(size) => {
                // SAFETY: mapped in `new_mapped` with exactly this size and
                // not unmapped since; nothing borrows it once we drop.
                unsafe { libc::munmap(self.ptr.as_ptr().cast(), size) };
            }
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let align = match self.alloc {
            Alloc::Heap(layout) => layout.align(),
            Alloc::Mapped(_) => 4096,
        };
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &align)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for (len, align) in [(0, 4096), (1, 512), (4096, 4096), (65536, 4096)] {
            let mut b = AlignedBuf::new(len, align).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % align, 0);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
        assert!(AlignedBuf::new(16, 3).is_none());
    }

    #[test]
    fn mapped_buffers_are_page_aligned_zeroed_and_writable() {
        for len in [0, 1, 4096, 3 << 20] {
            let mut b = AlignedBuf::new_mapped(len).unwrap();
            assert_eq!(b.as_ptr() as usize % 4096, 0);
            assert_eq!((b.len(), b.capacity()), (len, len));
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(5);
            assert!(b.as_slice().iter().all(|&x| x == 5));
        }
    }

    #[test]
    fn a_window_shows_part_of_the_buffer() {
        let mut b = AlignedBuf::new(8192, 4096).unwrap();
        b.as_mut_slice()[4096] = 9;
        assert!(b.set_window(4096..6000));
        assert_eq!((b.len(), b.capacity()), (1904, 8192));
        assert_eq!(b.as_slice()[0], 9);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(!b.set_window(4096..8193), "past the allocation");
        assert_eq!(b.len(), 1904, "a refused window changes nothing");
        b.full_window();
        assert_eq!((b.len(), b.as_slice()[4096]), (8192, 9));
    }

    #[test]
    fn length_is_exactly_what_was_asked() {
        // Shorter than the alignment, and not a multiple of it: no rounding.
        assert_eq!(AlignedBuf::new(1000, 4096).unwrap().len(), 1000);
        assert_eq!(AlignedBuf::new(5000, 4096).unwrap().len(), 5000);
        assert!(AlignedBuf::new(0, 64).unwrap().is_empty());
    }
}
