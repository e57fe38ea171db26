//! Building a queue's ring: the SQ/CQ sizes, the dup'd descriptors
//! registered as fixed files, the eventfd registered for completions, and
//! (where the kernel supports it) restrictions that let the ring run only
//! our four opcodes on those fixed files.

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

/// A ring of `entries` SQEs (CQ twice as big) with `files` dup'd and
/// registered as fixed files 0..n and `eventfd` signalled on each CQE.
/// Restricted to READV/WRITEV/FSYNC/FALLOCATE on fixed files when the
/// kernel allows (5.10+); unrestricted otherwise.
pub fn build_ring(
    files: &[Arc<File>],
    eventfd: &EventFd,
    entries: u32,
) -> Result<(Ring, Vec<File>), BlockError> {
    let dups = files
        .iter()
        .map(|f| f.try_clone())
        .collect::<Result<Vec<File>, _>>()
        .map_err(BlockError::UringSetup)?;
    let fds: Vec<i32> = dups.iter().map(|f| f.as_raw_fd()).collect();
    match restricted_ring(&fds, eventfd, entries) {
        Ok(ring) => Ok((ring, dups)),
        Err(e) => {
            log::debug!("io_uring restrictions unavailable ({e}); using an unrestricted ring");
            let ring = new_ring(entries, false)?;
            register(&ring, &fds, eventfd)?;
            Ok((ring, dups))
        }
    }
}

fn new_ring(entries: u32, disabled: bool) -> Result<Ring, BlockError> {
    let mut b = IoUring::builder();
    b.setup_cqsize(entries.saturating_mul(2).max(2));
    if disabled {
        b.setup_r_disabled();
    }
    b.build(entries.max(1)).map_err(BlockError::UringSetup)
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

fn restricted_ring(fds: &[i32], eventfd: &EventFd, entries: u32) -> Result<Ring, BlockError> {
    let ring = new_ring(entries, true)?;
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
    ring.submitter()
        .register_enable_rings()
        .map_err(BlockError::UringSetup)?;
    Ok(ring)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn restricted_ring_refuses_other_opcodes_and_raw_fds() {
        if !testkit::available("io_uring", crate::io::probe::uring_support()) {
            return;
        }
        let efd = EventFd::new(EFD_NONBLOCK).unwrap();
        let file = File::open("/proc/self/exe").unwrap();
        let Ok(mut ring) = restricted_ring(&[file.as_raw_fd()], &efd, 4) else {
            return; // kernel without restrictions: the fallback is tested elsewhere
        };
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
