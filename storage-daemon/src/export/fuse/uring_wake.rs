//! How a ring thread learns that its disk queue has completed I/O without
//! a syscall of its own: a POLL_ADD on the queue's completion eventfd
//! linked to a READ of it, both in the thread's FUSE ring, so the one
//! `io_uring_enter` the thread sleeps in waits for FUSE requests and
//! image I/O alike. The poll posts no CQE unless it fails; the READ's CQE
//! ([`COMPLETION_READ`]) says completions are ready, and the READ has
//! cleared the eventfd, so the thread takes them with
//! `DiskQueue::reap_completions`.
//!
//! Why the poll first: a READ alone was sometimes handed to an io-wq
//! worker that blocked in it (one more thread hop per wake-up); a
//! multishot POLL_ADD without any READ is made one-shot by the kernel on
//! wake-ups from another ring's eventfd signalling (EPOLL_URING_WAKE),
//! and the eventfd left set then made every re-arm fire at once.
//!
//! Enters as the eventfd and the ring ([`CompletionWake::arm`]); leaves as
//! the READ's CQE, which the thread hands to [`CompletionWake::fired`].

use std::os::unix::io::RawFd;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

/// `user_data` of the POLL_ADD (a CQE only when it fails) and of the READ.
pub const COMPLETION_POLL: u64 = u64::MAX;
pub const COMPLETION_READ: u64 = u64::MAX - 1;

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// The armed READ and the 8 bytes it reads into.
pub struct CompletionWake {
    /// Where the READ puts the counter; the kernel owns it while `armed`.
    count: Box<u64>,
    armed: bool,
}

impl CompletionWake {
    pub fn new() -> Self {
        CompletionWake {
            count: Box::new(0),
            armed: false,
        }
    }

    /// Queues the POLL_ADD and its READ on `ring` (submitted with the
    /// thread's next enter).
    pub fn arm(&mut self, ring: &mut Ring, eventfd: RawFd) -> std::io::Result<()> {
        let poll: squeue::Entry128 = opcode::PollAdd::new(types::Fd(eventfd), libc::POLLIN as u32)
            .build()
            .flags(squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS)
            .user_data(COMPLETION_POLL)
            .into();
        let buf: *mut u64 = &mut *self.count;
        let read: squeue::Entry128 = opcode::Read::new(types::Fd(eventfd), buf.cast(), 8)
            .build()
            .user_data(COMPLETION_READ)
            .into();
        // A link must not be split between two submits (the READ would
        // never run): make room for both first.
        while {
            let sq = ring.submission();
            sq.capacity() - sq.len() < 2
        } {
            ring.submit()?;
        }
        for sqe in [&poll, &read] {
            // SAFETY: the POLL_ADD references no memory; the READ writes
            // `self.count`, which outlives it (`disarm` waits for its CQE,
            // and Drop leaks the buffer if it is still armed).
            if unsafe { ring.submission().push(sqe) }.is_err() {
                return Err(std::io::Error::other("SQ full after making room"));
            }
        }
        self.armed = true;
        Ok(())
    }

    /// The READ's CQE came: the buffer is ours again. True when it read
    /// the counter (the eventfd is now clear).
    pub fn fired(&mut self, res: i32) -> bool {
        self.armed = false;
        res == 8
    }

    /// Ends an armed READ (at exit, before the buffer goes): signals the
    /// eventfd (`signal`) so it completes, and waits for its CQE. Other
    /// CQEs met on the way are dropped: the thread has nothing left.
    pub fn disarm(
        &mut self,
        ring: &mut Ring,
        signal: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if !self.armed {
            return Ok(());
        }
        signal()?;
        while self.armed {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
            if ring.completion().any(|c| c.user_data() == COMPLETION_READ) {
                self.armed = false;
            }
        }
        Ok(())
    }
}

impl Drop for CompletionWake {
    fn drop(&mut self) {
        if self.armed {
            // The kernel may still write the counter (a thread that ended
            // with an error): leak its 8 bytes.
            std::mem::forget(std::mem::replace(&mut self.count, Box::new(0)));
        }
    }
}
