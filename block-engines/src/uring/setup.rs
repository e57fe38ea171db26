//! Building a queue's ring: the SQ/CQ sizes, the dup'd descriptors
//! registered as fixed files, the eventfd registered for completions,
//! (where the kernel supports it) restrictions that let the ring run only
//! our four opcodes on those fixed files, cooperative task running, and
//! deferred task running with a single issuer.
//!
//! Cooperative task running (`IORING_SETUP_COOP_TASKRUN`, Linux 5.19):
//! a completion that the kernel finishes outside the queue's thread (a
//! write into an unwritten extent ends in a file-system workqueue) is
//! posted by task work on the thread that submitted it. Without the flag
//! the kernel interrupts that thread with an IPI to run it at once; with
//! it the work waits for the thread's next system call, which the queue's
//! thread makes constantly while busy (and a sleeping thread is still
//! woken). `IORING_SETUP_TASKRUN_FLAG` marks pending work in the SQ
//! flags, so a reap that would otherwise make no system call enters the
//! kernel to run it (`UringEngine::reap_cq`). fio sets the same flag. On
//! 4 KiB random writes into fallocated extents, QD 128, it raised our
//! io_uring engine from 77-87k to 103-112k IOPS (fio: 90-112k) and cut
//! the queue thread's CPU per request from 11.1-11.8 us to 8.5-9.2
//! (docs/performance.md, "What explains the limits").
//! Older kernels refuse the flags with EINVAL and get a ring without them.
//!
//! Deferred task running (`IORING_SETUP_DEFER_TASKRUN` with
//! `IORING_SETUP_SINGLE_ISSUER`, Linux 6.1; fio sets both): completions
//! that end outside the queue's thread (io-wq workers copying buffered
//! and tmpfs reads, device interrupts) are queued for that thread and
//! posted only when it enters the kernel to reap, as one batch, instead
//! of each being posted where it ended (the CQ lock and an eventfd signal
//! per completion) or run as task work at its next system call. The
//! registered eventfd is signalled once when the first of a batch is
//! queued, and `IORING_SQ_TASKRUN` tells a reap to enter
//! (`UringEngine::reap_cq`), so the queue's epoll loop is unchanged.
//! The kernel takes the ring's one issuer to be the thread that enables
//! it, so such a ring is built disabled and the engine enables it on its
//! first use ([`BuiltRing::enable_on_first_use`]): the thread that
//! submits, reaps and waits (a virtio-blk queue worker, built on the
//! activating thread). Another thread's enter or registration then fails
//! with EEXIST: a queue's engine belongs to the thread that first used
//! it. Dropping it elsewhere is safe (the executor has reaped every op;
//! the files' unregistering is refused and left to the kernel's teardown,
//! see `Drop for UringEngine`). Measured with `blk-bench` (4 KiB random
//! reads QD 32, 7-11 interleaved rounds; docs/performance.md, "Queue
//! scaling"): whole-process CPU per request less the driver 0.89-1.02 x
//! the cooperative-only ring on tmpfs raw and qcow2 (five runs, median
//! 0.96), 0.80 x on ext4; IOPS 1.09-1.28 x. Buffered writes showed no
//! difference beyond the noise (0.84-1.17 x CPU, 0.95-1.05 x IOPS).
//! Kernels before 6.1 refuse the flags and get a cooperative ring.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::register::Restriction;
use io_uring::{cqueue, opcode, squeue, IoUring};
use vmm_sys_util::eventfd::EventFd;

use crate::error::BlockError;

type Ring = IoUring<squeue::Entry, cqueue::Entry>;

/// `io_uring_register` opcodes our `Drop` uses after the ring is enabled.
const IORING_UNREGISTER_FILES: u8 = 3;
const IORING_UNREGISTER_EVENTFD: u8 = 5;

/// How a ring runs the task work that posts completions (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskRun {
    /// Deferred to the one issuer's reaping enters (6.1+).
    Deferred,
    /// Cooperative: at the submitting thread's next system call (5.19+).
    Cooperative,
    /// The kernel's default (an IPI to the submitting thread).
    Plain,
}

/// A queue's ring and what it was built with.
pub struct BuiltRing {
    pub ring: Ring,
    /// The dup'd descriptors registered as fixed files 0..n.
    pub files: Vec<File>,
    /// How the ring runs task work (see the module docs).
    pub task_run: TaskRun,
    /// The ring is still disabled: the thread that uses it first enables
    /// it and so becomes its single issuer (deferred task running).
    pub enable_on_first_use: bool,
}

/// A ring of `entries` SQEs (CQ twice as big) with `files` dup'd and
/// registered as fixed files 0..n and `eventfd` signalled on each CQE.
/// Restricted to READV/WRITEV/FSYNC/FALLOCATE on fixed files when the
/// kernel allows (5.10+); unrestricted otherwise.
pub fn build_ring(
    files: &[Arc<File>],
    eventfd: &EventFd,
    entries: u32,
) -> Result<BuiltRing, BlockError> {
    let dups = files
        .iter()
        .map(|f| f.try_clone())
        .collect::<Result<Vec<File>, _>>()
        .map_err(BlockError::UringSetup)?;
    let fds: Vec<i32> = dups.iter().map(|f| f.as_raw_fd()).collect();
    let (ring, task_run) = match restricted_ring(&fds, eventfd, entries) {
        Ok(built) => built,
        Err(e) => {
            log::debug!("io_uring restrictions unavailable ({e}); using an unrestricted ring");
            let (ring, task_run) = new_ring(entries)?;
            register(&ring, &fds, eventfd)?;
            if task_run != TaskRun::Deferred {
                enable(&ring)?;
            }
            (ring, task_run)
        }
    };
    Ok(BuiltRing {
        ring,
        files: dups,
        task_run,
        enable_on_first_use: task_run == TaskRun::Deferred,
    })
}

/// Enables a ring built disabled; with a single issuer, the calling
/// thread becomes it.
pub fn enable(ring: &Ring) -> Result<(), BlockError> {
    ring.submitter()
        .register_enable_rings()
        .map_err(BlockError::UringSetup)
}

/// The ring, disabled (registrations come first, then `enable`), with
/// the best task running the kernel offers (module docs).
fn new_ring(entries: u32) -> Result<(Ring, TaskRun), BlockError> {
    let mut b = IoUring::builder();
    b.setup_cqsize(entries.saturating_mul(2).max(2))
        .setup_r_disabled();
    let plain = b.clone();
    b.setup_coop_taskrun().setup_taskrun_flag();
    let cooperative = b.clone();
    b.setup_single_issuer().setup_defer_taskrun();
    for (builder, task_run) in [
        (b, TaskRun::Deferred),
        (cooperative, TaskRun::Cooperative),
        (plain, TaskRun::Plain),
    ] {
        match builder.build(entries.max(1)) {
            Ok(ring) => return Ok((ring, task_run)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && task_run != TaskRun::Plain => {
                log::debug!("io_uring without {task_run:?} task running (older kernel)");
            }
            Err(e) => return Err(BlockError::UringSetup(e)),
        }
    }
    unreachable!("the plain ring either builds or returns its error")
}

fn register(ring: &Ring, fds: &[i32], eventfd: &EventFd) -> Result<(), BlockError> {
    if !fds.is_empty() {
        ring.submitter()
            .register_files(fds)
            .map_err(BlockError::UringSetup)?;
    }
    ring.submitter()
        .register_eventfd(eventfd.as_raw_fd())
        .map_err(BlockError::UringSetup)
}

/// The ring restricted to our opcodes on fixed files; enabled unless it
/// defers task running (then its first user enables it).
fn restricted_ring(
    fds: &[i32],
    eventfd: &EventFd,
    entries: u32,
) -> Result<(Ring, TaskRun), BlockError> {
    let (ring, task_run) = new_ring(entries)?;
    register(&ring, fds, eventfd)?;
    let mut allow = [
        Restriction::sqe_op(opcode::Readv::CODE),
        Restriction::sqe_op(opcode::Writev::CODE),
        Restriction::sqe_op(opcode::Fsync::CODE),
        Restriction::sqe_op(opcode::Fallocate::CODE),
        Restriction::sqe_flags_required(squeue::Flags::FIXED_FILE.bits()),
        Restriction::register_op(IORING_UNREGISTER_FILES),
        Restriction::register_op(IORING_UNREGISTER_EVENTFD),
    ];
    ring.submitter()
        .register_restrictions(&mut allow)
        .map_err(BlockError::UringSetup)?;
    if task_run != TaskRun::Deferred {
        enable(&ring)?;
    }
    Ok((ring, task_run))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn restricted_ring_refuses_other_opcodes_and_raw_fds() {
        if !testkit::available("io_uring", crate::probe::uring_support()) {
            return;
        }
        let efd = EventFd::new(EFD_NONBLOCK).unwrap();
        let file = File::open("/proc/self/exe").unwrap();
        let Ok((mut ring, task_run)) = restricted_ring(&[file.as_raw_fd()], &efd, 4) else {
            return; // kernel without restrictions: the fallback is tested elsewhere
        };
        if task_run == TaskRun::Deferred {
            enable(&ring).unwrap();
        }
        let mut buf = [0u8; 16];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let entries = [
            opcode::Nop::new().build().user_data(1),
            // A raw descriptor instead of a fixed file.
            opcode::Readv::new(io_uring::types::Fd(file.as_raw_fd()), &iov, 1)
                .build()
                .user_data(2),
            opcode::Readv::new(io_uring::types::Fixed(0), &iov, 1)
                .build()
                .user_data(3),
        ];
        // One at a time: a refused SQE ends its submission batch.
        let mut results = Vec::new();
        for e in &entries {
            // SAFETY: `iov` and `buf` outlive the ring's use of them: each
            // op is waited for before the next is pushed.
            unsafe { ring.submission().push(e).unwrap() };
            ring.submit_and_wait(1).unwrap();
            results.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        }
        assert_eq!(results[0], (1, -libc::EACCES));
        assert_eq!(results[1], (2, -libc::EACCES));
        assert_eq!(results[2], (3, 16));
    }
}
