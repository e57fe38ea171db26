//! What a queue worker is given ([`QueueWorker`]), what it hands back
//! when it stops ([`WorkerExit`]), and what it keeps while it runs
//! ([`WorkerState`], with the chains in flight, [`PendingChain`]). The
//! event loop (`mod.rs`), the completion side (`completion.rs`), the
//! spin (`spin.rs`) and the command handling (`commands.rs`) each add
//! their methods to [`WorkerState`]; its definition sits below them all.

// foldhash: the keys are our own sequence numbers.
use foldhash::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{BlockRequest, Completion, DiskQueue};
use virtio_queue::Queue;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::control::WorkerCommand;
use crate::block::counters::{CountedOp, QueueCounterHandle};
use crate::block::rate_limit::RateLimiter;
use crate::block::request_parser::{ParseScratch, ParserLimits, DEVICE_ID_LEN};
use crate::device::VirtioInterrupt;
use ch_util::adaptive_poll::AdaptivePoll;

/// A chain handed to the disk and not yet completed.
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingChain {
    pub(super) head: u16,
    pub(super) status: GuestAddress,
    /// Reads report their data bytes in the used length.
    pub(super) is_read: bool,
    /// A write in writethrough mode: flush before completing it.
    pub(super) flush_after: bool,
    /// What to count it as, and when it was submitted.
    pub(super) op: CountedOp,
    pub(super) submitted: Instant,
}

/// Everything a worker needs; moved into its thread.
pub struct QueueWorker {
    pub index: u16,
    pub queue: Queue,
    pub kick: EventFd,
    /// Written (any value) after a command was sent on `commands`.
    pub control: Arc<EventFd>,
    pub commands: Receiver<WorkerCommand>,
    /// This queue's counters (only this worker writes them).
    pub counters: QueueCounterHandle,
    pub mem: Arc<GuestMemoryMmap>,
    pub interrupt: Arc<dyn VirtioInterrupt>,
    pub disk: DiskQueue,
    pub limits: ParserLimits,
    pub device_id: [u8; DEVICE_ID_LEN],
    /// False in writethrough mode (config space `writeback` = 0).
    pub writeback: Arc<AtomicBool>,
    /// The longest the worker spins for work before it sleeps (zero:
    /// never; capped at [`MAX_POLL`](super::MAX_POLL)); the spin itself adapts below it.
    pub poll: Duration,
    /// Submit and complete each request on its own instead of the whole
    /// batch at once: set for the sync engine, which runs a submission's
    /// requests one after another before any completes, so the driver
    /// gets the first results while the rest of the batch still runs.
    pub submit_each: bool,
    /// This queue's token buckets when it is throttled. They belong to
    /// the device and come back in [`WorkerExit`], so a guest cannot
    /// refill them by resetting the device.
    pub limiter: Option<RateLimiter>,
    /// Host CPUs the worker thread pins itself to (`None`: not pinned).
    pub cpus: Option<Vec<usize>>,
}

/// What a stopped worker hands back.
pub struct WorkerExit {
    pub kick: EventFd,
    /// The queue with its ring positions as the worker left them (every
    /// chain it took is in the used ring), so a transport that stops one
    /// queue at a time (vhost-user's GET_VRING_BASE) can report them.
    pub queue: Queue,
    /// The queue's buckets, as the worker left them.
    pub limiter: Option<RateLimiter>,
}

/// The loop's state besides the inputs.
pub(super) struct WorkerState {
    pub(super) w: QueueWorker,
    pub(super) pending: HashMap<u64, PendingChain>,
    pub(super) next_seq: u64,
    pub(super) batch: Vec<BlockRequest>,
    /// The batch's writes while its other requests are submitted (see
    /// `submit_parsed`); empty between passes.
    pub(super) held_here: Vec<BlockRequest>,
    pub(super) completions: Vec<Completion>,
    /// Parser buffers and recycled segment lists (no allocation per chain).
    pub(super) scratch: ParseScratch,
    pub(super) used_added: bool,
    /// The invalid-ring warning was logged (once per activation, so a
    /// guest cannot flood the log by kicking).
    pub(super) ring_warned: bool,
    /// The avail ring was found invalid; do not look at it again until the
    /// next kick (keeps `avail_pending` from spinning).
    pub(super) ring_stuck: bool,
    /// The buckets, when the queue is throttled, and the timer that ends
    /// a wait for them.
    pub(super) limiter: Option<RateLimiter>,
    pub(super) throttle_timer: Option<TimerFd>,
    /// A chain went back on the ring for want of tokens; the timer is
    /// armed and nothing is taken from the ring until it fires.
    pub(super) throttled: bool,
    /// The last pass over the ring stopped at its bound with chains still
    /// available: the next epoll wait must not sleep.
    pub(super) more_available: bool,
    /// A pause was asked for: answer here once nothing is in flight.
    pub(super) pause_ack: Option<Sender<u16>>,
    /// When the current pass over the ring started (the submission time
    /// of the requests it takes; one clock read per pass).
    pub(super) pass_started: Instant,
    /// How long to spin before the next sleep, per kind of wait.
    pub(super) poll: AdaptivePoll,
    /// The spin reaped completions without clearing the completion
    /// eventfd: clear it (and reap again) before sleeping, or the sleep
    /// would end at once.
    pub(super) signal_stale: bool,
}
