//! The FUSE-over-io_uring transport (Linux 6.14+, protocol 7.42): one
//! thread per possible CPU, each owning half the ring entries of two
//! kernel queues (its CPU's and the next; [`served_queues`]), its own
//! io_uring (SQE128) and its own [`DiskQueue`].
//!
//! At start ([`setup_rings`], after the INIT reply) every entry is
//! registered: an `IORING_OP_URING_CMD` REGISTER whose iovecs point at the
//! entry's header buffer ([`UringReqHeader`]) and payload buffer (in the
//! thread's [`PayloadArea`], where READ/WRITE do their I/O in place). The
//! kernel completes the command when it has put a request there; the
//! thread dispatches it with the same handlers as /dev/fuse, and answers
//! with COMMIT_AND_FETCH (reply in the same buffers), which also re-arms
//! the entry. Requests that need image I/O go to the disk queue; a
//! POLL_ADD on its completion eventfd linked to a READ of it, both in the
//! same ring ([`super::uring_wake`]), completes when I/O is done, so one
//! `io_uring_enter` waits for both the kernel's requests and the I/O, and
//! the thread takes the completions with [`DiskQueue::reap_completions`]
//! and no syscall of its own.
//! Before it sleeps there, the thread enters without waiting (which runs
//! the ring's deferred task work) for an adaptive while
//! ([`super::poll`]), so a request or completion that comes soon finds it
//! awake.
//!
//! The ring is DEFER_TASKRUN and SINGLE_ISSUER where the kernel allows
//! (see [`build_ring`]). The threads are not pinned: the kernel queues a
//! request on the queue of the CPU the application submitted it from, so
//! a thread pinned to its queue's CPU would always compete with the
//! submitting application for that CPU (an application submitting deep
//! queues from one thread then shares one CPU with the daemon while the
//! others idle); the scheduler places an unpinned thread on an idle CPU.
//!
//! Teardown: after the connection ends the kernel completes every armed
//! entry with -ENOTCONN; the thread stops when every entry is gone and no
//! I/O is in flight. The buffers are freed only then (else leaked: the
//! kernel may still write into an entry it holds).

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use block::{BlockRequest, Completion, Disk, DiskQueue, IoMemory};
use io_uring::{cqueue, squeue, IoUring};

use super::abi::{
    InHeader, OutHeader, Pod, UringCmdReq, UringReqHeader, URING_CMD_COMMIT_AND_FETCH,
};
use super::attr::ExportState;
use super::handler::dispatch;
use super::reply::{Action, Pending, Reply};
use super::request::FuseRequest;
use super::uring_payload::{PayloadArea, PAYLOAD_SIZE};
use super::uring_setup::{
    build_ring, fuse_cmd, possible_cpus, register_sqe, served_queues, RingError, SERVERS_PER_QUEUE,
};
use super::uring_wake::{CompletionWake, COMPLETION_POLL, COMPLETION_READ};
use ch_util::adaptive_poll::{AdaptivePoll, WaitKind};

/// Ring entries per kernel queue, all threads together (qemu's series
/// uses 64): at least fio's depth 64 from one CPU.
const ENTRIES_PER_QUEUE: usize = 64;
/// `io_uring_enter` flag: run task work and reap completions (not
/// re-exported by the io-uring crate).
const IORING_ENTER_GETEVENTS: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryState {
    /// Registered or committed: the kernel owns the buffers.
    Armed,
    /// Holds a request whose block I/O is in flight.
    Busy {
        unique: u64,
        commit_id: u64,
        pending: Pending,
    },
    /// Completed with an error (connection gone): never armed again.
    Gone,
}

/// One ring entry: the buffers the kernel reads requests into.
struct RingEntry {
    /// The kernel queue it is registered on.
    qid: u16,
    header: Box<UringReqHeader>,
    state: EntryState,
}

/// One ring thread's state: its io_uring, its share of the entries of
/// the kernel queues it serves, its disk queue.
pub struct RingQueue {
    /// The thread's number (0..number of kernel queues).
    index: u16,
    /// The kernel queues it serves, and its entries on each.
    serves: Vec<u16>,
    entries_per_queue: usize,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Made with DEFER_TASKRUN and still disabled: the serving thread
    /// enables it, becoming its single issuer.
    deferred: bool,
    /// The session's /dev/fuse descriptor (shared with its reader).
    session: Arc<File>,
    entries: Vec<RingEntry>,
    disk: DiskQueue,
    state: Arc<ExportState>,
    /// Requests taken, for the log line at the end.
    served: u64,
    /// Entries holding a request whose block I/O is in flight, and the
    /// most seen at once (the log line at the end: how deep the kernel
    /// fills this queue).
    busy: usize,
    peak_busy: usize,
    /// `io_uring_enter` calls on this ring, for the log line.
    enters: u64,
    /// Sum of `busy` at each enter (mean in flight while waiting).
    busy_at_enters: u64,
    poll: AdaptivePoll,
    /// Enters that did not wait (spinning), for the log line.
    spins: u64,
    /// The armed POLL_ADD + READ of the disk queue's eventfd.
    wake: CompletionWake,
    /// The entries' payload buffers (entry i's at index i).
    payloads: PayloadArea,
}

/// Creates one ring thread per kernel queue (each registers its entries
/// in its own thread, see [`RingQueue::run`]).
pub fn setup_rings(
    disk: &Disk,
    session: &File,
    state: &Arc<ExportState>,
    poll_max: Duration,
) -> Result<Vec<RingQueue>, RingError> {
    let session = Arc::new(session.try_clone().map_err(|e| RingError::Create(0, e))?);
    let queues = possible_cpus()?;
    let servers = usize::from(queues.min(SERVERS_PER_QUEUE));
    let entries_per_queue = ENTRIES_PER_QUEUE / servers;
    // At most 2 x 64 entries: fits.
    let ring_size = (entries_per_queue * servers) as u32;
    let mut threads = Vec::new();
    for index in 0..queues {
        let (ring, deferred) = build_ring(ring_size).map_err(|e| RingError::Create(index, e))?;
        let disk_queue = disk.queue().map_err(|e| RingError::DiskQueue(index, e))?;
        let serves = served_queues(index, queues);
        let payloads = PayloadArea::new(serves.len() * entries_per_queue)
            .map_err(|e| RingError::Create(index, e))?;
        let thread = RingQueue {
            index,
            serves,
            entries_per_queue,
            ring,
            deferred,
            session: session.clone(),
            entries: Vec::new(),
            disk: disk_queue,
            state: state.clone(),
            served: 0,
            busy: 0,
            peak_busy: 0,
            enters: 0,
            busy_at_enters: 0,
            poll: AdaptivePoll::new(poll_max),
            spins: 0,
            wake: CompletionWake::new(),
            payloads,
        };
        threads.push(thread);
    }
    Ok(threads)
}

impl RingQueue {
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Registers this thread's entries on every queue. Returns the CQEs already posted: a request
    /// may arrive in an entry before the last one is registered.
    fn register_entries(&mut self) -> Result<Vec<(u64, i32)>, RingError> {
        let fd = self.session.as_raw_fd();
        let per_queue = self.entries_per_queue;
        let slots: Vec<u16> = (self.serves.iter())
            .flat_map(|&q| std::iter::repeat_n(q, per_queue))
            .collect();
        for (i, qid) in slots.into_iter().enumerate() {
            let mut header = Box::<UringReqHeader>::default();
            let Some(payload) = self.payloads.host_ptr(i) else {
                return Err(RingError::Submit(
                    self.index,
                    std::io::Error::other("more entries than payload buffers"),
                ));
            };
            let iov = [
                libc::iovec {
                    iov_base: (&mut *header as *mut UringReqHeader).cast(),
                    iov_len: std::mem::size_of::<UringReqHeader>(),
                },
                libc::iovec {
                    iov_base: payload.cast(),
                    iov_len: PAYLOAD_SIZE,
                },
            ];
            let sqe = register_sqe(fd, qid, &iov, i as u64);
            self.entries.push(RingEntry {
                qid,
                header,
                state: EntryState::Armed,
            });
            // SAFETY: the iovecs point at buffers owned by `self.entries`,
            // which outlive the registration (freed only once the kernel
            // has completed the entry, or leaked, see Drop); the iovec
            // array itself is read during the submit below.
            let pushed = unsafe { self.ring.submission().push(&sqe) };
            if pushed.is_err() {
                return Err(RingError::Submit(
                    self.index,
                    std::io::Error::other("SQ full"),
                ));
            }
            // The kernel copies the iovecs at submit time: submit while
            // `iov` is alive.
            self.ring
                .submit()
                .map_err(|e| RingError::Submit(self.index, e))?;
        }
        // A refused REGISTER completes at once; a good one stays armed
        // until a request arrives (res 0), which must not be lost.
        let posted: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        match posted.iter().find(|&&(_, res)| res < 0) {
            Some(&(_, res)) => Err(RingError::Register(
                self.index,
                std::io::Error::from_raw_os_error(-res),
            )),
            None => Ok(posted),
        }
    }

    /// Registers the entries (the INIT reply must have been sent) and
    /// reports the outcome on `registered`, then serves the queue until
    /// every entry is gone and no I/O is in flight.
    ///
    /// The registering thread must be the serving thread: the kernel
    /// copies each request into the entry's buffers in the context of the
    /// task that submitted the command.
    pub fn run(
        mut self,
        registered: std::sync::mpsc::Sender<Result<(), RingError>>,
    ) -> std::io::Result<()> {
        if self.deferred {
            // Registers this thread as the ring's single issuer.
            if let Err(e) = self.ring.submitter().register_enable_rings() {
                let _ = registered.send(Err(RingError::Enable(self.index, e)));
                return Ok(());
            }
        }
        let mut early = Vec::new();
        match self.register_entries() {
            Ok(posted) => {
                early = posted;
                let _ = registered.send(Ok(()));
            }
            Err(e) => {
                let reason = e.to_string();
                let _ = registered.send(Err(e));
                // Entries registered before the failure end with the
                // connection; serve until then.
                log::debug!("fuse ring {}: {reason}", self.index);
            }
        }
        self.arm_wake()?;
        let mut completions = Vec::new();
        let mut batch = Vec::new();
        for (tag, res) in early {
            self.take_request(tag as usize, res, &mut batch)?;
        }
        if !batch.is_empty() {
            self.disk.submit_batch_requests(batch.drain(..));
        }
        loop {
            let alive = self.entries.iter().any(|e| e.state != EntryState::Gone);
            if !alive && self.disk.in_flight() == 0 {
                let eventfd = self.disk.completion_eventfd();
                self.wake.disarm(&mut self.ring, || eventfd.write(1))?;
                log::info!(
                    "fuse ring thread {}: served {} requests, at most {} in flight, {} ring enters, {:.1} in flight at an enter on average, {} waits ended by polling ({} polling enters)",
                    self.index,
                    self.served,
                    self.peak_busy,
                    self.enters,
                    self.busy_at_enters as f64 / self.enters.max(1) as f64,
                    self.poll.caught,
                    self.spins
                );
                return Ok(());
            }
            self.enters += 1;
            self.busy_at_enters += self.busy as u64;
            match self.wait() {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
            let cqes: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (tag, res) in cqes {
                if tag == COMPLETION_READ {
                    let cleared = self.wake.fired(res);
                    self.answer_completions(cleared, res, &mut completions)?;
                    self.arm_wake()?;
                } else if tag == COMPLETION_POLL {
                    // The poll failed; its READ ends with ECANCELED.
                    log::debug!(
                        "fuse ring {}: eventfd poll: {}",
                        self.index,
                        std::io::Error::from_raw_os_error(-res)
                    );
                } else {
                    self.take_request(tag as usize, res, &mut batch)?;
                }
            }
            if !batch.is_empty() {
                self.disk.submit_batch_requests(batch.drain(..));
            }
        }
    }

    /// Submits what is queued and waits for at least one CQE: first by
    /// entering without waiting for the adaptive spin budget, then
    /// sleeping in `io_uring_enter`.
    fn wait(&mut self) -> std::io::Result<()> {
        let kind = if self.busy == 0 {
            WaitKind::Request
        } else {
            WaitKind::Completion
        };
        let ring = &mut self.ring;
        let spins = &mut self.spins;
        self.poll.wait(kind, |sleep| {
            if sleep {
                ring.submit_and_wait(1)?;
                return Ok(Some(()));
            }
            *spins += 1;
            let queued = ring.submission().len() as u32;
            // SAFETY: no argument struct; the queued SQEs reference
            // buffers `self` keeps alive (see `push`). GETEVENTS with
            // min_complete 0 runs the deferred task work and returns.
            unsafe {
                ring.submitter().enter::<libc::sigset_t>(
                    queued,
                    0,
                    IORING_ENTER_GETEVENTS,
                    None,
                )?;
            }
            Ok((!ring.completion().is_empty()).then_some(()))
        })?;
        Ok(())
    }

    fn arm_wake(&mut self) -> std::io::Result<()> {
        let fd = self.disk.completion_eventfd().as_raw_fd();
        self.wake.arm(&mut self.ring, fd)
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> std::io::Result<()> {
        loop {
            // SAFETY: the SQEs pushed here (COMMIT_AND_FETCH whose buffers
            // were registered) reference no memory beyond what `self`
            // keeps alive.
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// A CQE of entry `index`: a request (res 0) or the entry's end.
    fn take_request(
        &mut self,
        index: usize,
        res: i32,
        batch: &mut Vec<BlockRequest>,
    ) -> std::io::Result<()> {
        let Some(entry) = self.entries.get_mut(index) else {
            log::error!("fuse ring {}: CQE for unknown entry {index}", self.index);
            return Ok(());
        };
        if res < 0 {
            if res != -libc::ENOTCONN {
                log::warn!(
                    "fuse ring {}: entry {index} ended: {}",
                    self.index,
                    std::io::Error::from_raw_os_error(-res)
                );
            }
            entry.state = EntryState::Gone;
            return Ok(());
        }
        self.served += 1;
        let header = InHeader::read_from(&entry.header.in_out).unwrap_or_default();
        let ent = entry.header.ring_ent_in_out;
        let req = FuseRequest {
            header,
            arg: &entry.header.op_in,
            data: self.payloads.bytes(index, ent.payload_sz as usize),
            in_place: self.payloads.in_place(index),
        };
        if ent.commit_id != header.unique {
            log::debug!(
                "fuse ring {}: commit id {} for request {}",
                self.index,
                ent.commit_id,
                header.unique
            );
        }
        match dispatch(&self.state, &req) {
            Action::Reply(reply) => self.commit(index, header.unique, ent.commit_id, &reply),
            Action::Submit {
                mut request,
                pending,
            } => {
                request.user_data = index as u64;
                self.busy += 1;
                self.peak_busy = self.peak_busy.max(self.busy);
                entry.state = EntryState::Busy {
                    unique: header.unique,
                    commit_id: ent.commit_id,
                    pending,
                };
                batch.push(request);
                Ok(())
            }
        }
    }

    /// The READ of the eventfd ended with `res`: answers every finished
    /// request. The READ cleared the eventfd, unless it failed.
    fn answer_completions(
        &mut self,
        cleared: bool,
        res: i32,
        completions: &mut Vec<Completion>,
    ) -> std::io::Result<()> {
        if cleared {
            self.disk.reap_completions(completions);
        } else {
            log::debug!(
                "fuse ring {}: eventfd read: {}",
                self.index,
                std::io::Error::from_raw_os_error(-res)
            );
            self.disk.drain_completions(completions);
        }
        for c in completions.drain(..) {
            let index = c.user_data as usize;
            let Some(EntryState::Busy {
                unique,
                commit_id,
                pending,
            }) = self.entries.get(index).map(|e| e.state)
            else {
                log::error!(
                    "fuse ring {}: completion for idle entry {index}",
                    self.index
                );
                continue;
            };
            self.busy = self.busy.saturating_sub(1);
            let reply = pending.reply(unique, c);
            self.commit(index, unique, commit_id, &reply)?;
        }
        Ok(())
    }

    /// Writes `reply` into entry `index`'s buffers and commits it (which
    /// re-arms the entry for the next request).
    fn commit(
        &mut self,
        index: usize,
        unique: u64,
        commit_id: u64,
        reply: &Reply,
    ) -> std::io::Result<()> {
        let fd = self.session.as_raw_fd();
        let thread = self.index;
        let Some(entry) = self.entries.get_mut(index) else {
            return Ok(());
        };
        let qid = entry.qid;
        let payload = self.payloads.bytes_mut(index);
        let (error, len) = match reply {
            // Read in place: the data is in the payload already.
            Reply::Data(IoMemory::Guest { segments, .. }) => {
                let len: usize = segments.iter().map(|s| s.len as usize).sum();
                (0, len.min(payload.len()))
            }
            _ => {
                let (error, body) = reply.parts();
                if body.len() > payload.len() {
                    log::error!(
                        "fuse ring {thread}: a {}-byte reply does not fit",
                        body.len()
                    );
                    (-libc::EIO, 0)
                } else {
                    payload[..body.len()].copy_from_slice(body);
                    (error, body.len())
                }
            }
        };
        let out = OutHeader {
            len: (std::mem::size_of::<OutHeader>() + len) as u32,
            error,
            unique,
        };
        entry.header.in_out = [0; 128];
        entry.header.in_out[..out.as_bytes().len()].copy_from_slice(out.as_bytes());
        entry.header.ring_ent_in_out.payload_sz = len as u32;
        entry.state = EntryState::Armed;
        let cmd = UringCmdReq {
            commit_id,
            qid,
            ..Default::default()
        };
        let sqe = fuse_cmd(fd, URING_CMD_COMMIT_AND_FETCH, &cmd)
            .build()
            .user_data(index as u64);
        self.push(&sqe)
    }
}

impl Drop for RingQueue {
    fn drop(&mut self) {
        let entries = std::mem::take(&mut self.entries);
        if entries.iter().any(|e| e.state != EntryState::Gone) {
            // The kernel may still hold some entries and write into their
            // buffers: leak them rather than free memory it points at.
            log::warn!(
                "fuse ring {}: leaking buffers of entries still registered",
                self.index
            );
            std::mem::forget(entries);
            self.payloads.leak();
        }
    }
}
