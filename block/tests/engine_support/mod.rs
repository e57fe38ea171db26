//! Engine-specific helpers for the engine and conformance tests: a
//! blocking driver over a `DiskQueue`, request builders, guest memory
//! scatter/gather, and fault-injecting engines and formats (submodules).
//! Temp dirs, qemu tools and the PRNG live in `support` (the test file
//! includes both with `mod support; mod engine_support;`).
#![allow(dead_code)]

pub mod conformance;
pub mod faults;
pub mod hold;
pub mod scripted;

use std::sync::Arc;

use block::request::GuestSegment;
use block::{BlockRequest, Completion, DiskQueue, IoMemory, RequestOp};
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// Submits `reqs` and blocks until each has completed; returns the
/// completions in user_data order.
pub fn run_batch(q: &mut DiskQueue, reqs: Vec<BlockRequest>) -> Vec<Completion> {
    let n = reqs.len();
    q.submit_batch_requests(reqs);
    let mut out = Vec::new();
    while out.len() < n {
        wait_completions_within(q, &mut out, QUEUE_LIMIT);
        assert!(out.len() <= n, "more completions than requests");
    }
    assert_eq!(q.in_flight(), 0);
    out.sort_by_key(|c| c.user_data);
    out
}

/// Like [`run_batch`], but drives the queue the way a device worker does:
/// sleep in poll(2) on the completion eventfd, then drain. A queue that
/// leaves work unsubmitted when it returns (say, a resubmitted short read)
/// never wakes, and this panics after 10 s instead of hanging.
pub fn run_batch_polling(q: &mut DiskQueue, reqs: Vec<BlockRequest>) -> Vec<Completion> {
    let n = reqs.len();
    q.submit_batch_requests(reqs);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            completion_signalled(q, 10_000),
            "queue stalled: {} of {n} completions after 10 s",
            out.len()
        );
        q.drain_completions(&mut out);
        assert!(out.len() <= n, "more completions than requests");
    }
    assert_eq!(q.in_flight(), 0);
    out.sort_by_key(|c| c.user_data);
    out
}

pub use crate::support::{completion_signalled, wait_completions_within, QUEUE_LIMIT};

pub fn read_req(user_data: u64, offset: u64, len: usize) -> BlockRequest {
    BlockRequest {
        user_data,
        op: RequestOp::Read,
        offset,
        memory: IoMemory::Owned(vec![0xee; len]),
    }
}

pub fn write_req(user_data: u64, offset: u64, data: Vec<u8>) -> BlockRequest {
    BlockRequest {
        user_data,
        op: RequestOp::Write,
        offset,
        memory: IoMemory::Owned(data),
    }
}

pub fn op_req(user_data: u64, op: RequestOp, offset: u64) -> BlockRequest {
    BlockRequest {
        user_data,
        op,
        offset,
        memory: IoMemory::None,
    }
}

/// Guest memory for requests that scatter over several segments.
pub fn guest_memory(size: usize) -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).unwrap())
}

/// `len` bytes spread over segments of `seg` bytes placed `gap` apart
/// starting at guest address `base` (the gap makes them non-contiguous).
pub fn scattered(base: u64, len: u32, seg: u32, gap: u64) -> Vec<GuestSegment> {
    let mut v = Vec::new();
    let mut left = len;
    let mut addr = base;
    while left > 0 {
        let n = left.min(seg);
        v.push(GuestSegment {
            addr: GuestAddress(addr),
            len: n,
        });
        addr += u64::from(n) + gap;
        left -= n;
    }
    v
}

/// Copies guest segments out (or in) for checks.
pub fn guest_read(mem: &GuestMemoryMmap, segs: &[GuestSegment]) -> Vec<u8> {
    use vm_memory::Bytes;
    let mut out = Vec::new();
    for s in segs {
        let mut b = vec![0u8; s.len as usize];
        mem.read_slice(&mut b, s.addr).unwrap();
        out.extend_from_slice(&b);
    }
    out
}

pub fn guest_write(mem: &GuestMemoryMmap, segs: &[GuestSegment], data: &[u8]) {
    use vm_memory::Bytes;
    let mut pos = 0;
    for s in segs {
        mem.write_slice(&data[pos..pos + s.len as usize], s.addr)
            .unwrap();
        pos += s.len as usize;
    }
}

/// The bytes of a completed request's owned buffer.
pub trait OwnedBytes {
    /// Panics unless the memory is [`IoMemory::Owned`].
    fn owned_bytes(&self) -> &[u8];
}

impl OwnedBytes for IoMemory {
    fn owned_bytes(&self) -> &[u8] {
        match self {
            IoMemory::Owned(v) => v,
            _ => panic!("request memory is not owned"),
        }
    }
}

/// The data of the only (or first) completion, which must own its buffer.
pub fn first_data(done: Vec<Completion>) -> Vec<u8> {
    done.into_iter()
        .next()
        .expect("a completion")
        .memory
        .into_owned()
        .expect("owned request memory")
}
