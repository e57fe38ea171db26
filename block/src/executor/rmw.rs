//! Locks on the partial blocks of unaligned O_DIRECT writes, shared by all
//! queues of a disk.
//!
//! An unaligned write under O_DIRECT reads its first and last partial
//! blocks, merges its bytes and writes whole blocks back. Two such writes
//! that share a block without overlapping would each write back the other's
//! old bytes. Before planning such a write the executor locks its partial
//! guest blocks here ([`RmwLocks::try_lock`]); a write that finds one
//! locked is parked and its queue's waker registered, and
//! [`RmwLocks::unlock`] wakes it when the holder completes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::formats::Waker;

/// See the module docs.
#[derive(Default)]
pub struct RmwLocks {
    held: Mutex<Vec<Held>>,
}

struct Held {
    block: u64,
    owner: u64,
    waiters: Vec<Waker>,
}

impl RmwLocks {
    /// Locks every block of `blocks` for `owner`, or none of them: on a
    /// conflict `waker` is registered with the holder and `false` returned.
    pub fn try_lock(&self, blocks: &[u64], owner: u64, waker: &Waker) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.iter_mut().find(|h| blocks.contains(&h.block)) {
            if !h.waiters.iter().any(|w| std::sync::Arc::ptr_eq(w, waker)) {
                h.waiters.push(waker.clone());
            }
            return false;
        }
        held.extend(blocks.iter().map(|&block| Held {
            block,
            owner,
            waiters: Vec::new(),
        }));
        true
    }

    /// Releases every block `owner` holds and wakes whoever waited for one.
    pub fn unlock(&self, owner: u64) {
        let mut woken = Vec::new();
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.retain_mut(|h| {
                if h.owner == owner {
                    woken.append(&mut h.waiters);
                    false
                } else {
                    true
                }
            });
        }
        for w in woken {
            // Only fails on counter overflow, when a wake-up is pending anyway.
            let _ = w.write(1);
        }
    }
}

/// A lock owner id, unique in the process.
pub fn new_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The partial blocks (indices, `block`-byte units) of `offset..offset+len`.
pub fn partial_blocks(offset: u64, len: u64, block: u64) -> Vec<u64> {
    let mut v = Vec::new();
    if block <= 1 || len == 0 {
        return v;
    }
    let Some(end) = offset.checked_add(len) else {
        return v;
    };
    if !offset.is_multiple_of(block) {
        v.push(offset / block);
    }
    if !end.is_multiple_of(block) && !v.contains(&((end - 1) / block)) {
        v.push((end - 1) / block);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    #[test]
    fn partial_blocks_of_ranges() {
        assert_eq!(partial_blocks(0, 4096, 4096), Vec::<u64>::new());
        assert_eq!(partial_blocks(100, 200, 4096), vec![0]);
        assert_eq!(partial_blocks(4000, 200, 4096), vec![0, 1]);
        assert_eq!(partial_blocks(4096, 5000, 4096), vec![2]);
        assert_eq!(partial_blocks(100, 200, 1), Vec::<u64>::new());
    }

    #[test]
    fn conflicting_lock_waits_and_is_woken() {
        let locks = RmwLocks::default();
        let a = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let b = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        assert!(locks.try_lock(&[1, 2], 10, &a));
        assert!(!locks.try_lock(&[2, 3], 11, &b));
        assert!(locks.try_lock(&[3], 12, &b));
        assert!(b.read().is_err(), "not woken yet");
        locks.unlock(10);
        assert_eq!(b.read().unwrap(), 1);
        assert!(locks.try_lock(&[2], 11, &b));
    }
}
