//! A write planned in place into host cluster H is still in flight when a
//! discard of the same guest cluster frees H; after a flush H is allocated
//! to another guest cluster and written. Without care the late write lands
//! on H and corrupts the other cluster. The executor holds the discard's
//! commit (which frees H) until every write planned before the discard
//! has completed, so H is reused only once nothing can still write to it.
//!
//! The same holds for every other way a commit can free H: write-zeroes
//! without unmap flags the cluster zero and keeps H (at once, in its
//! plan), and a later partial write of the cluster allocates a new host
//! cluster and releases H in its commit. That commit, too, waits for the
//! older write.
//!
//! Deterministic: queue A's engine holds its writes (`HoldEngine`) until
//! the test opens the gate.

mod engine_support;
mod support;

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use block::engines::new_engine;
use block::{Completion, Disk, DiskOptions, DiskQueue, EngineKind, ImageType, RequestOp};
use engine_support::hold::HoldEngine;
use engine_support::*;
use support::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const CLUSTER: usize = 64 << 10;

/// Drains `q` (sleeping on its eventfd, 10 s at most per wait) until every
/// request in `want` has completed; returns those completions.
fn drive(q: &mut DiskQueue, want: &[u64], out: &mut Vec<Completion>) -> Vec<Completion> {
    loop {
        q.drain_completions(out);
        if want.iter().all(|u| out.iter().any(|c| c.user_data == *u)) {
            let (mine, rest) = std::mem::take(out)
                .into_iter()
                .partition(|c| want.contains(&c.user_data));
            *out = rest;
            return mine;
        }
        let mut pfd = libc::pollfd {
            fd: q.completion_eventfd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert!(r != 0, "queue stalled waiting for {want:?}");
    }
}

/// Drains `q` a few times without blocking.
fn drain_idle(q: &mut DiskQueue, out: &mut Vec<Completion>) {
    for _ in 0..3 {
        q.drain_completions(out);
    }
}

/// How the test frees host cluster H while the write into it is held.
#[derive(Clone, Copy)]
enum Free {
    /// A discard of guest cluster 0.
    Discard,
    /// Write-zeroes without unmap (H kept, flagged zero), then a partial
    /// write of guest cluster 0 (a new host cluster; H released).
    ZeroThenPartialWrite,
}

fn run(kind: EngineKind) {
    run_with(kind, Free::Discard)
}

fn run_with(kind: EngineKind, free: Free) {
    let dir = temp_dir("discard-race");
    let path = dir.join("img.qcow2");
    let p = path.to_str().unwrap();
    qemu_create("qcow2", p, "4M", "cluster_size=65536");
    qemu_io("qcow2", &path, &["write -P 0xaa 0 64k"]);

    let mut o = DiskOptions::new(&path);
    o.image_type = ImageType::Format("qcow2");
    o.engine = kind;
    let disk = Disk::open(&o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let inner = new_engine(kind, disk.format().files().local(), efd).unwrap();
    let (hold, gate) = HoldEngine::new(inner);
    let mut qa = disk.queue_on(Box::new(hold));
    // The sync engine finishes the discard (and so frees H, if nothing
    // stops it) before `submit_batch_requests` returns.
    let mut qb = disk.queue_with_engine(EngineKind::Sync).unwrap();
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());

    // W: an in-place write of guest cluster 0, held in flight.
    qa.submit_batch_requests([write_req(1, 0, vec![0x11; CLUSTER])]);
    drain_idle(&mut qa, &mut out_a);
    assert!(out_a.is_empty(), "the write is held");

    // Free H (a discard, or write-zeroes then a partial write), flush,
    // and write guest cluster 16 (which allocates: it would get host
    // cluster H if H were free).
    let held = match free {
        Free::Discard => {
            qb.submit_batch_requests([op_req(
                2,
                RequestOp::Discard {
                    len: CLUSTER as u64,
                },
                0,
            )]);
            vec![2]
        }
        Free::ZeroThenPartialWrite => {
            qb.submit_batch_requests([op_req(
                2,
                RequestOp::WriteZeroes {
                    len: CLUSTER as u64,
                    may_unmap: false,
                },
                0,
            )]);
            drain_idle(&mut qb, &mut out_b);
            qb.submit_batch_requests([write_req(7, 0, vec![0x33; 4096])]);
            vec![2, 7]
        }
    };
    drain_idle(&mut qb, &mut out_b);
    qb.submit_batch_requests([op_req(3, RequestOp::Flush, 0)]);
    for c in drive(&mut qb, &[3], &mut out_b) {
        c.result.unwrap();
    }
    let g1 = 16 * CLUSTER as u64;
    qb.submit_batch_requests([write_req(4, g1, vec![0x22; CLUSTER])]);
    for c in drive(&mut qb, &[4], &mut out_b) {
        c.result.unwrap();
    }

    // W lands now.
    gate.store(false, Ordering::SeqCst);
    for c in drive(&mut qa, &[1], &mut out_a) {
        c.result.unwrap();
    }
    for c in drive(&mut qb, &held, &mut out_b) {
        c.result.unwrap();
    }

    let done = drive_batch(
        &mut qb,
        vec![read_req(5, g1, CLUSTER), read_req(6, 0, CLUSTER)],
    );
    let other = done[0].memory.owned_bytes().to_vec();
    assert!(
        other.iter().all(|&b| b == 0x22),
        "guest cluster 16 was overwritten by the late write (first byte {:#x})",
        other[0]
    );
    let freed = done[1].memory.owned_bytes().to_vec();
    match free {
        Free::Discard => assert!(
            freed.iter().all(|&b| b == 0),
            "guest cluster 0 reads zeroes"
        ),
        Free::ZeroThenPartialWrite => {
            assert!(
                freed[..4096].iter().all(|&b| b == 0x33),
                "the partial write"
            );
            assert!(freed[4096..].iter().all(|&b| b == 0), "zeroes after it");
        }
    }

    drop(qa);
    drop(qb);
    disk.close().unwrap();
    drop(disk);
    qemu_img(&["check", "-q", p]);
}

fn drive_batch(q: &mut DiskQueue, reqs: Vec<block::BlockRequest>) -> Vec<Completion> {
    let want: Vec<u64> = reqs.iter().map(|r| r.user_data).collect();
    q.submit_batch_requests(reqs);
    let mut out = Vec::new();
    let mut done = drive(q, &want, &mut out);
    done.sort_by_key(|c| c.user_data);
    for c in &done {
        assert!(c.result.is_ok(), "request {}: {:?}", c.user_data, c.result);
    }
    done
}

#[test]
fn a_discard_does_not_free_a_cluster_under_an_in_flight_write_sync() {
    run(EngineKind::Sync);
}

#[test]
fn a_discard_does_not_free_a_cluster_under_an_in_flight_write_uring() {
    if !testkit::available("io_uring", block::engines::probe::uring_support()) {
        return;
    }
    run(EngineKind::IoUring);
}

#[test]
fn a_discard_does_not_free_a_cluster_under_an_in_flight_write_threads() {
    run(EngineKind::Threads);
}

#[test]
fn a_discard_does_not_free_a_cluster_under_an_in_flight_write_aio() {
    run(EngineKind::Aio);
}

#[test]
fn a_partial_write_after_write_zeroes_does_not_free_a_cluster_under_an_in_flight_write_sync() {
    run_with(EngineKind::Sync, Free::ZeroThenPartialWrite);
}

#[test]
fn a_partial_write_after_write_zeroes_does_not_free_a_cluster_under_an_in_flight_write_uring() {
    if !testkit::available("io_uring", block::engines::probe::uring_support()) {
        return;
    }
    run_with(EngineKind::IoUring, Free::ZeroThenPartialWrite);
}
