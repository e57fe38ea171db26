//! [`CachePadded`]: a value alone on its cache lines, so that a field one
//! thread writes does not share a line with fields other threads read or
//! write (false sharing makes every write by one queue a cache miss for
//! the others).
//!
//! 128 bytes: x86's adjacent-line prefetcher pulls cache lines in pairs,
//! so two values 64 bytes apart still interfere there. A few lines of our
//! own rather than a dependency for one attribute.

use std::ops::{Deref, DerefMut};

/// `T` aligned (and so padded) to 128 bytes.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CachePadded<T>(pub T);

impl<T> Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for CachePadded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_sit_on_different_lines() {
        let v = [CachePadded(1u64), CachePadded(2u64)];
        let a = &v[0].0 as *const u64 as usize;
        let b = &v[1].0 as *const u64 as usize;
        assert_eq!(b - a, 128);
        assert_eq!(*v[1], 2);
    }
}
