//! The per-queue worker of virtio-blk: one thread, one epoll loop.
//!
//! Data enters as guest notifications on the queue's kick eventfd: the
//! worker pops the available chains, parses them with
//! [`super::request_parser`], and hands the disk requests to its
//! [`DiskQueue`] with `submit_batch_requests`, a large batch in slices
//! whose completions go back before the next slice is parsed
//! ([`WorkerState::process_available`]); nothing stays unsubmitted when it
//! sleeps. Data leaves through the disk queue's completion eventfd
//! (`completion.rs`): the worker drains the completions, writes each
//! status byte, adds the used entries and raises at most one interrupt
//! per drain (suppressed when the driver's EVENT_IDX says so). After
//! every wake-up the worker also looks at the avail index (a guest-memory
//! read), so chains posted while it was completing others are taken
//! without waiting for a kick.
//! The kick eventfd is edge-triggered and never read. Before it sleeps
//! the worker looks for work without sleeping for an adaptive time
//! (`spin.rs`, [`ch_util::adaptive_poll`]; the
//! ceiling is [`QueueWorker::poll`]). Optional throttling ([`super::rate_limit`]): a
//! chain the buckets cannot pay for yet goes back on the ring, and the
//! worker takes no more until a timer (a fourth epoll source) says the
//! buckets have refilled. With the sync engine each request is submitted
//! and completed on its own ([`QueueWorker::submit_each`]); where the
//! engine makes writes in this thread during submit (io_uring's buffered
//! writes on most file systems), each write is
//! ([`WorkerState::submit_parsed`]). A write on the
//! control eventfd stops the worker once every request in flight has
//! completed; the thread then returns its kick eventfd and its queue.
//! The control eventfd signals commands (`control.rs`: stop, pause,
//! resume); completed requests are counted in the queue's own
//! [`super::counters`].
//!
//! The same worker serves both front ends: the in-VMM virtio-pci device
//! (kick = an ioeventfd, interrupt = MSI-X) and the storage daemon's
//! vhost-user-blk export (kick = an eventfd the export's vring thread
//! writes, interrupt = the vring's call eventfd); it only sees a [`Queue`],
//! guest memory, an eventfd and a [`VirtioInterrupt`].

// foldhash: the keys are our own sequence numbers.
use foldhash::{HashMap, HashMapExt};
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::request::GuestSegment;
use block::{BlockRequest, IoMemory, RequestOp};
use log::{debug, error, warn};
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use super::affinity::pin_current_thread;
use super::request_parser::{
    parse_chain_with, ParseScratch, ParsedChain, RequestWork, DEVICE_ID_LEN,
};
use ch_util::adaptive_poll::AdaptivePoll;

mod commands;
mod completion;
mod control;
mod spin;
mod state;
mod tokens;

use commands::ControlOutcome;
pub use control::{SwapAnswer, WorkerCommand, WorkerControl};
use spin::Spin;
use state::{PendingChain, WorkerState};
pub use state::{QueueWorker, WorkerExit};

use tokens::{COMPLETION, CONTROL, KICK, THROTTLE_TIMER};

/// The longest busy poll a worker does before sleeping.
pub const MAX_POLL: Duration = Duration::from_millis(1);

/// Batches of at least twice this many chains are submitted in slices
/// (see [`WorkerState::process_available`]); smaller ones go whole.
pub const MIN_SLICE: usize = 16;

impl QueueWorker {
    /// Runs until stopped through the control eventfd (or a fatal epoll
    /// error); returns the kick eventfd.
    pub fn run(mut self) -> WorkerExit {
        if let Some(cpus) = &self.cpus {
            if let Err(e) = pin_current_thread(cpus) {
                error!(
                    "virtio-blk queue {}: cannot pin to CPUs {cpus:?}: {e}",
                    self.index
                );
            }
        }
        let limiter = self.limiter.take();
        // Writes made at submit go one at a time here (`submit_parsed`).
        self.disk.allow_writes_at_submit();
        let poll = AdaptivePoll::new(self.poll.min(MAX_POLL));
        let mut state = WorkerState {
            w: self,
            pending: HashMap::new(),
            next_seq: 0,
            batch: Vec::new(),
            held_here: Vec::new(),
            completions: Vec::new(),
            scratch: ParseScratch::default(),
            used_added: false,
            ring_warned: false,
            ring_stuck: false,
            limiter,
            throttle_timer: None,
            throttled: false,
            more_available: false,
            pause_ack: None,
            pass_started: Instant::now(),
            poll,
            signal_stale: false,
        };
        if let Err(e) = state.event_loop() {
            error!("virtio-blk queue {}: worker stopped: {e}", state.w.index);
        }
        debug!(
            "virtio-blk queue {}: {} waits, {} ended by the spin",
            state.w.index, state.poll.waits, state.poll.caught
        );
        WorkerExit {
            kick: state.w.kick,
            queue: state.w.queue,
            limiter: state.limiter,
        }
    }
}

impl WorkerState {
    fn event_loop(&mut self) -> io::Result<()> {
        let epoll = Epoll::new()?;
        // The kick eventfd is edge-triggered: every driver write is a new
        // edge, so the worker never has to read (clear) it, which saves a
        // syscall per kick. The completion eventfd stays level-triggered
        // because the disk queue clears it on each drain.
        if self.limiter.is_some() {
            let timer = TimerFd::new()?;
            epoll.ctl(
                ControlOperation::Add,
                timer.as_raw_fd(),
                EpollEvent::new(EventSet::IN, THROTTLE_TIMER),
            )?;
            self.throttle_timer = Some(timer);
        }
        for (fd, token, events) in [
            (
                self.w.kick.as_raw_fd(),
                KICK,
                EventSet::IN | EventSet::EDGE_TRIGGERED,
            ),
            (
                self.w.disk.completion_eventfd().as_raw_fd(),
                COMPLETION,
                EventSet::IN,
            ),
            (self.w.control.as_raw_fd(), CONTROL, EventSet::IN),
        ] {
            epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))?;
        }
        // The driver may have made chains available before activation.
        self.process_available();
        let mut events = [EpollEvent::default(); 4];
        let mut stopping = false;
        loop {
            if stopping && self.pending.is_empty() && self.w.disk.in_flight() == 0 {
                return Ok(());
            }
            if !stopping && self.ready_to_park() {
                if self.park(&epoll) == ControlOutcome::Stop {
                    stopping = true;
                }
                continue;
            }
            // A worker asked to pause takes no new chains, so it does not
            // spin either (the spin takes chains off the ring).
            let taking = !stopping && self.pause_ack.is_none();
            // Chains left on the ring by a bounded pass: look at the
            // other sources without sleeping, then take them.
            let sleeps = !self.more_available || stopping;
            let wait = self.wait_kind();
            let wait_start = Instant::now();
            let mut spin = Spin::Expired;
            if sleeps && taking {
                spin = self.poll_before_sleep(wait, wait_start);
                if spin == Spin::Caught {
                    continue;
                }
            }
            if sleeps && self.signal_stale && self.process_completions() > 0 {
                continue;
            }
            let n = match epoll.wait(if sleeps { -1 } else { 0 }, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if sleeps && !matches!(spin, Spin::Contended | Spin::Skipped) {
                self.poll.record(wait, wait_start.elapsed(), false);
            }
            // Taken: the pass below sets it again if it stops at its bound
            // (a guest that moves the avail index back cannot make this
            // loop spin).
            self.more_available = false;
            let mut kicked = false;
            let mut completed = false;
            for event in &events[..n] {
                match event.data() {
                    KICK => {
                        kicked = true;
                        self.ring_stuck = false;
                    }
                    COMPLETION => completed = true,
                    CONTROL => stopping |= self.take_commands() == ControlOutcome::Stop,
                    THROTTLE_TIMER => {
                        if let Some(timer) = &mut self.throttle_timer {
                            // Disarming clears the expiry, so the
                            // level-triggered fd stops reporting (a read
                            // could block if it had been re-armed).
                            let _ = timer.clear();
                        }
                        self.throttled = false;
                        kicked = true;
                    }
                    _ => {}
                }
            }
            if completed {
                self.process_completions();
            }
            // After completing a batch the driver has often posted new
            // chains already (its kick may still be on the way): take them
            // now instead of after another trip through epoll.
            let taking = !stopping && self.pause_ack.is_none();
            if taking && !self.throttled && (kicked || self.avail_pending()) {
                self.process_available();
            }
        }
    }

    /// True when the driver has made chains available that the worker has
    /// not taken yet (one guest-memory read, no syscall).
    fn avail_pending(&self) -> bool {
        if self.ring_stuck {
            return false;
        }
        match self.w.queue.avail_idx(&*self.w.mem, Ordering::Acquire) {
            Ok(idx) => idx.0 != self.w.queue.next_avail(),
            Err(_) => false,
        }
    }

    /// Pops and parses the available chains and hands them to the disk.
    ///
    /// A large batch goes in slices: once half of what the ring held at
    /// the start of a pass (at least [`MIN_SLICE`]) is parsed, that slice
    /// is submitted and the completions ready so far are returned (with an
    /// interrupt if the driver waits for one) before the rest is parsed.
    /// Reads that need no device I/O (holes, unwritten extents) complete
    /// inside the submission, so the driver gets the first half back and
    /// refills it while the worker works on the second: the two threads
    /// overlap instead of taking turns (docs/performance.md, "What explains
    /// the limits").
    ///
    /// One call takes at most one queue size of chains, so a driver that
    /// keeps posting cannot hold the worker away from its other sources
    /// (stop requests, completions); if chains remain, `more_available`
    /// makes the event loop come back without sleeping.
    fn process_available(&mut self) {
        let mem = Arc::clone(&self.w.mem);
        self.more_available = false;
        self.pass_started = Instant::now();
        let bound = usize::from(self.w.queue.size()).max(1);
        let mut taken = 0usize;
        // A pass that pops nothing although the ring says more is there
        // happens once in a race with the driver; twice in a row means the
        // ring is invalid (avail idx too far ahead): stop until the next kick.
        let mut empty_passes = 0;
        loop {
            if let Err(e) = self.w.queue.disable_notification(&*mem) {
                warn!(
                    "virtio-blk queue {}: disable notification: {e}",
                    self.w.index
                );
            }
            let slice = self.slice_len(&mem);
            let mut popped = 0usize;
            while taken < bound {
                let Some(chain) = self.w.queue.pop_descriptor_chain(&*mem) else {
                    break;
                };
                let head = chain.head_index();
                let parsed = parse_chain_with(&mem, chain, &self.w.limits, &mut self.scratch);
                if !self.admit(&parsed) {
                    // Back on the ring, taken again when the timer fires.
                    self.w.queue.go_to_previous_position();
                    self.recycle_parsed(parsed);
                    break;
                }
                self.dispatch(&mem, head, parsed);
                popped += 1;
                taken += 1;
                if !self.w.submit_each && self.batch.len() >= slice {
                    self.submit_parsed();
                    self.process_completions();
                }
            }
            if self.throttled {
                break;
            }
            if taken >= bound {
                // Notifications stay as they are: the loop comes back.
                self.more_available = self.avail_pending();
                if self.more_available {
                    break;
                }
            }
            empty_passes = if popped == 0 { empty_passes + 1 } else { 0 };
            match self.w.queue.enable_notification(&*mem) {
                Ok(true) if empty_passes >= 2 => {
                    self.ring_stuck = true;
                    if !self.ring_warned {
                        self.ring_warned = true;
                        warn!(
                            "virtio-blk queue {}: available ring is invalid; waiting for a reset",
                            self.w.index
                        );
                    }
                    break;
                }
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    warn!(
                        "virtio-blk queue {}: enable notification: {e}",
                        self.w.index
                    );
                    break;
                }
            }
        }
        if self.w.submit_each {
            // Notifications are re-enabled (avail_event written) before the
            // driver sees any of these completions, so its next chain kicks.
            let mut batch = std::mem::take(&mut self.batch);
            for request in batch.drain(..) {
                self.w.disk.submit_batch_requests(std::iter::once(request));
                self.process_completions();
            }
            self.batch = batch;
        } else {
            self.submit_parsed();
        }
        self.w.counters.set_in_flight(self.pending.len());
        self.notify_if_needed();
    }

    /// Submits the parsed batch in one go; but where the engine makes
    /// writes in this thread during submit (`DiskQueue::writes_at_submit`:
    /// io_uring's buffered writes on most file systems), the other
    /// requests go first, in one go, and then each write on its own and
    /// answered before the next, so the driver sees the first done while
    /// the rest are written instead of all of them at the end.
    fn submit_parsed(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        if !self.w.disk.writes_at_submit() {
            self.w.disk.submit_batch_requests(self.batch.drain(..));
            return;
        }
        let mut here = std::mem::take(&mut self.held_here);
        here.extend(self.batch.extract_if(.., |r| r.op == RequestOp::Write));
        if !self.batch.is_empty() {
            self.w.disk.submit_batch_requests(self.batch.drain(..));
        }
        for request in here.drain(..) {
            self.w.disk.submit_batch_requests(std::iter::once(request));
            // Without reading the completion eventfd (one system call
            // per request): it is cleared before the worker sleeps.
            self.reap_finished();
        }
        self.held_here = here;
    }

    /// How many parsed chains make a slice in this pass: half of what the
    /// ring holds now, at least [`MIN_SLICE`] (see `process_available`).
    fn slice_len(&self, mem: &GuestMemoryMmap) -> usize {
        let held = match self.w.queue.avail_idx(mem, Ordering::Acquire) {
            Ok(idx) => usize::from(idx.0.wrapping_sub(self.w.queue.next_avail())),
            Err(_) => 0,
        };
        held.div_ceil(2).max(MIN_SLICE)
    }

    /// Whether the rate limiter (if any) lets `parsed` through now; if
    /// not, arms the timer for when it will and marks the queue throttled.
    /// A request pays one op and, for reads and writes, its data bytes.
    fn admit(&mut self, parsed: &ParsedChain) -> bool {
        let (Some(limiter), Some(timer)) = (&mut self.limiter, &mut self.throttle_timer) else {
            return true;
        };
        let bytes = match parsed {
            ParsedChain::Request {
                work:
                    RequestWork::Disk {
                        op: RequestOp::Read | RequestOp::Write,
                        segments,
                        ..
                    },
                ..
            } => segments.iter().map(|s| u64::from(s.len)).sum(),
            _ => 0,
        };
        match limiter.admit(bytes, Instant::now()) {
            Ok(()) => true,
            Err(wait) => {
                if let Err(e) = timer.reset(wait, None) {
                    // Without a timer the queue would never wake up:
                    // let the request through instead.
                    warn!("virtio-blk queue {}: throttle timer: {e}", self.w.index);
                    return true;
                }
                self.throttled = true;
                false
            }
        }
    }

    /// Gives a parsed chain's segment lists back to the parser's pool.
    fn recycle_parsed(&mut self, parsed: ParsedChain) {
        if let ParsedChain::Request {
            work: RequestWork::Disk { segments, .. } | RequestWork::GetId { segments },
            ..
        } = parsed
        {
            self.scratch.recycle(segments);
        }
    }

    fn dispatch(&mut self, mem: &Arc<GuestMemoryMmap>, head: u16, parsed: ParsedChain) {
        let (status, work) = match parsed {
            ParsedChain::Unanswerable(e) => {
                debug!(
                    "virtio-blk queue {}: chain {head} dropped: {e}",
                    self.w.index
                );
                self.add_used(head, 0);
                return;
            }
            ParsedChain::Request { status, work } => (status, work),
        };
        match work {
            RequestWork::Disk {
                op,
                offset,
                segments,
            } => {
                let memory = if segments.is_empty() {
                    IoMemory::None
                } else {
                    // Not `IoMemory::guest`, which checks every segment
                    // against the memory map: the parser has placed each
                    // inside one region, and the executor translates them
                    // (checking again) before any host pointer exists; a
                    // segment that fails there completes with an error
                    // status like any failed request. One lookup per
                    // segment instead of two.
                    IoMemory::Guest {
                        mem: Arc::clone(mem),
                        segments,
                    }
                };
                let flush_after =
                    op == RequestOp::Write && !self.w.writeback.load(Ordering::Relaxed);
                let user_data = self.track(PendingChain {
                    head,
                    status,
                    is_read: op == RequestOp::Read,
                    flush_after,
                    op: op.into(),
                    submitted: self.pass_started,
                });
                self.batch.push(BlockRequest {
                    user_data,
                    op,
                    offset,
                    memory,
                });
            }
            RequestWork::GetId { segments } => match self.write_device_id(mem, &segments) {
                Some(written) => self.complete(head, status, VIRTIO_BLK_S_OK as u8, written + 1),
                None => self.complete(head, status, VIRTIO_BLK_S_IOERR as u8, 1),
            },
            RequestWork::Nothing => self.complete(head, status, VIRTIO_BLK_S_OK as u8, 1),
            RequestWork::Reject(e) => {
                debug!(
                    "virtio-blk queue {}: chain {head} refused: {e}",
                    self.w.index
                );
                self.complete(head, status, e.status(), 1);
            }
        }
    }

    /// Records a chain in flight; the user data is the head index in the
    /// low 16 bits and a sequence number above, so a driver that reuses a
    /// head still in flight cannot confuse two requests.
    fn track(&mut self, chain: PendingChain) -> u64 {
        let user_data = (self.next_seq << 16) | u64::from(chain.head);
        self.next_seq = (self.next_seq + 1) & ((1 << 48) - 1);
        self.pending.insert(user_data, chain);
        user_data
    }

    /// Writes the device ID; returns the bytes written.
    fn write_device_id(&self, mem: &GuestMemoryMmap, segments: &[GuestSegment]) -> Option<u32> {
        let mut done = 0usize;
        for seg in segments {
            let n = (seg.len as usize).min(DEVICE_ID_LEN - done);
            mem.write_slice(&self.w.device_id[done..done + n], seg.addr)
                .ok()?;
            done += n;
        }
        u32::try_from(done).ok()
    }
}
