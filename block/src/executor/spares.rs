//! Storage recycled from finished requests, so a steady stream of small
//! requests allocates nothing per request for its plan, op list, iovec
//! lists and host segment list.
//!
//! Finished entries give their vectors back ([`Spares::put_ops`],
//! [`Spares::put_segs`]); new requests take them ([`Spares::ops`],
//! [`Spares::iov`], [`Spares::segs`]). Only empty vectors are kept, at
//! most [`MAX_SPARES`] of each kind and none that grew large, so the
//! memory held stays small and bounded.

use super::table::OpSlot;
use crate::executor::memory::HostSegments;
use crate::formats::ReadPlan;

/// At most this many spare vectors of each kind.
pub const MAX_SPARES: usize = 256;

/// Vectors longer than this are freed rather than kept.
const MAX_KEPT_LEN: usize = 64;

/// An empty iovec list (no pointers inside, so it may cross threads).
struct SpareIov(Vec<libc::iovec>);

// SAFETY: the vector is always empty: it holds no pointer.
unsafe impl Send for SpareIov {}

/// See the module docs.
#[derive(Default)]
pub struct Spares {
    iovs: Vec<SpareIov>,
    ops: Vec<Vec<OpSlot>>,
    segs: Vec<HostSegments>,
    /// The read plan buffer (one request is planned at a time).
    pub plan: ReadPlan,
}

impl Spares {
    pub fn iov(&mut self) -> Vec<libc::iovec> {
        self.iovs.pop().map(|s| s.0).unwrap_or_default()
    }

    pub fn ops(&mut self) -> Vec<OpSlot> {
        self.ops.pop().unwrap_or_default()
    }

    pub fn segs(&mut self) -> HostSegments {
        self.segs.pop().unwrap_or_default()
    }

    /// Takes back a finished request's ops (and their iovec lists).
    #[inline]
    pub fn put_ops(&mut self, mut ops: Vec<OpSlot>) {
        for op in ops.iter_mut() {
            let mut iov = std::mem::take(&mut op.iov);
            if self.iovs.len() < MAX_SPARES && iov.capacity() <= MAX_KEPT_LEN {
                iov.clear();
                self.iovs.push(SpareIov(iov));
            }
        }
        ops.clear();
        if self.ops.len() < MAX_SPARES && ops.capacity() <= MAX_KEPT_LEN {
            self.ops.push(ops);
        }
    }

    pub fn put_segs(&mut self, mut segs: HostSegments) {
        if self.segs.len() < MAX_SPARES && segs.capacity() <= MAX_KEPT_LEN {
            segs.clear();
            self.segs.push(segs);
        }
    }
}
