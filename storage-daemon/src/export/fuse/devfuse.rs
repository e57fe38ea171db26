//! The classic transport: one thread per /dev/fuse descriptor (the
//! session's and its FUSE_DEV_IOC_CLONE copies), each with its own
//! [`DiskQueue`]. The first thread always takes requests; the others only
//! while the export is loaded ([`super::reader_gate`]), and otherwise wait
//! for their own completions and for the first thread's kick. While a
//! helper takes requests it keeps off the first thread's CPU
//! ([`super::helper_cpu`]).
//!
//! The thread waits in epoll on two things: its non-blocking /dev/fuse
//! descriptor and its disk queue's completion eventfd; before sleeping
//! there it asks epoll without a timeout for an adaptive while
//! ([`super::poll`]), so a request or completion that comes soon finds
//! it awake. Readable /dev/fuse:
//! it reads every request there is, answers what needs no I/O at once and
//! submits the rest as one batch of block requests. A signal of the
//! eventfd (watched edge-triggered, never read): it reaps the completions
//! ([`DiskQueue::reap_completions`]) and writes their replies. So reading never
//! waits for image I/O. The thread ends when the connection is gone
//! (ENODEV, after the unmount or an abort) and nothing is in flight.

use std::fs::File;
use std::io::{IoSlice, Read, Write};
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use block::{BlockRequest, Completion, DiskQueue};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::abi::{OutHeader, Pod};
use super::attr::ExportState;
use super::handler::dispatch;
use super::helper_cpu::HelperCpu;
use super::limits::DEV_BUFFER_SIZE;
use super::reader_gate::{QuietSince, ReaderGate};
use super::reply::{Action, Pending, Reply};
use super::request::{FuseRequest, ParseError};
use ch_util::adaptive_poll::{AdaptivePoll, WaitKind};

const FUSE_EVENT: u64 = 0;
const COMPLETION_EVENT: u64 = 1;
/// A helper's kick eventfd: the first thread wants it to read.
const KICK_EVENT: u64 = 2;

/// Writes `reply` to request `unique` on a /dev/fuse descriptor. A
/// request the kernel gave up on (interrupted, connection gone) makes the
/// write fail with ENOENT or ENODEV; callers log and carry on.
pub fn write_reply(dev: &File, unique: u64, reply: &Reply) -> std::io::Result<()> {
    if let Reply::Nothing = reply {
        return Ok(());
    }
    let (error, body) = reply.parts();
    let header = OutHeader {
        len: (std::mem::size_of::<OutHeader>() + body.len()) as u32,
        error,
        unique,
    };
    let n = (&*dev).write_vectored(&[IoSlice::new(header.as_bytes()), IoSlice::new(body)])?;
    if n != header.len as usize {
        return Err(std::io::Error::other(format!(
            "short reply write: {n} of {}",
            header.len
        )));
    }
    Ok(())
}

/// Requests submitted to the disk queue, by `user_data`.
#[derive(Default)]
struct InFlight {
    slots: Vec<Option<(u64, Pending)>>,
    free: Vec<usize>,
}

impl InFlight {
    fn insert(&mut self, unique: u64, pending: Pending) -> u64 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some((unique, pending));
                i as u64
            }
            None => {
                self.slots.push(Some((unique, pending)));
                (self.slots.len() - 1) as u64
            }
        }
    }

    fn remove(&mut self, user_data: u64) -> Option<(u64, Pending)> {
        let i = usize::try_from(user_data).ok()?;
        let taken = self.slots.get_mut(i)?.take();
        if taken.is_some() {
            self.free.push(i);
        }
        taken
    }
}

/// One /dev/fuse queue: its descriptor, its disk queue, its thread's state.
pub struct DevQueue {
    dev: File,
    disk: DiskQueue,
    state: Arc<ExportState>,
    in_flight: InFlight,
    connection_gone: bool,
    /// Requests read, for the log line at the end.
    served: u64,
    /// The most requests in flight on the disk queue at once.
    peak_in_flight: usize,
    waits: u64,
    in_flight_at_waits: u64,
    poll: AdaptivePoll,
    gate: Arc<ReaderGate>,
    /// `Some(i)`: helper `i`, reading /dev/fuse only when the gate says
    /// so; `None`: the first thread, always reading.
    helper: Option<usize>,
    /// /dev/fuse is in this thread's epoll set.
    reading: bool,
    /// A helper's view of how long the export has been quiet.
    quiet: QuietSince,
    /// A helper's CPU placement (made on its own thread in `run`).
    cpu: Option<HelperCpu>,
}

impl DevQueue {
    /// `dev` is switched to non-blocking here. `helper`: see
    /// [`super::reader_gate`] (`None` for the first thread).
    pub fn new(
        dev: File,
        disk: DiskQueue,
        state: Arc<ExportState>,
        poll_max: Duration,
        gate: Arc<ReaderGate>,
        helper: Option<usize>,
    ) -> std::io::Result<Self> {
        // SAFETY: F_SETFL on a descriptor `dev` owns.
        let rc = unsafe { libc::fcntl(dev.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(DevQueue {
            dev,
            disk,
            state,
            in_flight: InFlight::default(),
            connection_gone: false,
            served: 0,
            peak_in_flight: 0,
            waits: 0,
            in_flight_at_waits: 0,
            poll: AdaptivePoll::new(poll_max),
            gate,
            helper,
            reading: false,
            quiet: QuietSince::default(),
            cpu: None,
        })
    }

    /// Serves requests until the connection is gone and every request in
    /// flight has been answered.
    pub fn run(mut self) -> std::io::Result<()> {
        let epoll = Epoll::new()?;
        match self.helper.and_then(|i| self.gate.kick_fd(i)) {
            Some(kick) => epoll.ctl(
                ControlOperation::Add,
                kick.as_raw_fd(),
                EpollEvent::new(EventSet::IN, KICK_EVENT),
            )?,
            None => self.set_reading(&epoll, true)?,
        }
        if self.helper.is_some() {
            self.cpu = HelperCpu::of_current_thread()
                .map_err(|e| log::debug!("fuse: a queue helper's CPUs: {e}"))
                .ok();
        }
        // Edge-triggered: reported at every signal of the eventfd, so the
        // thread never reads (clears) it and reaps without a syscall.
        epoll.ctl(
            ControlOperation::Add,
            self.disk.completion_eventfd().as_raw_fd(),
            EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, COMPLETION_EVENT),
        )?;
        let mut buf = vec![0u8; DEV_BUFFER_SIZE];
        let mut events = vec![EpollEvent::default(); 3];
        let mut completions = Vec::new();
        while !(self.connection_gone && self.disk.in_flight() == 0) {
            if let Some(i) = self.helper {
                let read = self.gate.helper_should_read(
                    i,
                    self.disk.in_flight(),
                    &mut self.quiet,
                    std::time::Instant::now(),
                );
                if let Err(e) = self.set_reading(&epoll, read && !self.connection_gone) {
                    // The first thread still reads: this one only stops
                    // taking requests and ends once its own are answered.
                    log::error!("fuse: watching /dev/fuse in a queue helper: {e}");
                    self.connection_gone = true;
                }
                if let Some(cpu) = self.cpu.as_mut() {
                    if self.reading {
                        cpu.keep_off(self.gate.primary_cpu());
                    } else {
                        cpu.release();
                    }
                }
            }
            self.waits += 1;
            self.in_flight_at_waits += self.disk.in_flight() as u64;
            let n = match self.wait(&epoll, &mut events) {
                Ok(n) => n,
                // The usual interruption is the disk queue's io_uring
                // running its completion work in this thread: the
                // completions are ready, take them without another wait.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    self.answer_completions(&mut completions);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                match ev.data() {
                    // Stop watching a dead descriptor (it stays readable).
                    FUSE_EVENT if self.connection_gone => self.set_reading(&epoll, false)?,
                    FUSE_EVENT => self.read_requests(&mut buf),
                    KICK_EVENT => {
                        if let Some(i) = self.helper {
                            self.gate.take_kick(i);
                        }
                    }
                    _ => self.answer_completions(&mut completions),
                }
            }
        }
        log::info!(
            "fuse /dev/fuse queue {}: served {} requests, at most {} in flight, {} waits, {:.1} in flight at a wait on average, {} of them ended by polling{}",
            std::thread::current().name().unwrap_or("?"),
            self.served,
            self.peak_in_flight,
            self.waits,
            self.in_flight_at_waits as f64 / self.waits.max(1) as f64,
            self.poll.caught,
            match self.helper {
                None => format!(", helpers armed {} times by the load", self.gate.kicks()),
                Some(_) => String::new(),
            }
        );
        Ok(())
    }

    /// Adds /dev/fuse to the thread's epoll set or takes it out.
    fn set_reading(&mut self, epoll: &Epoll, read: bool) -> std::io::Result<()> {
        if read == self.reading {
            return Ok(());
        }
        let fd = self.dev.as_raw_fd();
        if read {
            // Every clone of the session descriptor waits on the same
            // kernel queue: EXCLUSIVE wakes one queue thread per request
            // instead of all of them (the others would only read EAGAIN).
            // The end of the connection still wakes every thread.
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN | EventSet::EXCLUSIVE, FUSE_EVENT),
            )?;
        } else {
            epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default())?;
        }
        self.reading = read;
        Ok(())
    }

    /// Waits for events: first by asking epoll without sleeping for the
    /// adaptive spin budget, then sleeping in it.
    fn wait(&mut self, epoll: &Epoll, events: &mut [EpollEvent]) -> std::io::Result<usize> {
        let kind = if self.disk.in_flight() == 0 {
            WaitKind::Request
        } else {
            WaitKind::Completion
        };
        let found = self.poll.wait(kind, |sleep| {
            let n = epoll.wait(if sleep { -1 } else { 0 }, events)?;
            Ok((n > 0 || sleep).then_some(n))
        })?;
        Ok(found.unwrap_or(0))
    }

    /// Reads until /dev/fuse is empty and submits what needs I/O: the
    /// first request at once when the disk queue is idle, the rest as
    /// one batch.
    fn read_requests(&mut self, buf: &mut [u8]) {
        let mut batch: Vec<BlockRequest> = Vec::new();
        loop {
            let n = match (&self.dev).read(buf) {
                // /dev/fuse never reads empty: the other end is gone.
                Ok(0) => {
                    self.connection_gone = true;
                    break;
                }
                Ok(n) => n,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    // The kernel dropped the request (interrupted): next.
                    Some(libc::EINTR) | Some(libc::ENOENT) => continue,
                    Some(libc::ENODEV) => {
                        self.connection_gone = true;
                        break;
                    }
                    _ => {
                        log::error!("fuse: reading /dev/fuse: {e}");
                        self.connection_gone = true;
                        break;
                    }
                },
            };
            let req = match FuseRequest::from_dev_buffer(&buf[..n]) {
                Ok(req) => req,
                Err(ParseError::NoHeader) => {
                    log::debug!("fuse: a {n}-byte read holds no request header");
                    continue;
                }
                Err(ParseError::BadLength(h)) => {
                    log::debug!("fuse: request {} says {} bytes, read {n}", h.unique, h.len);
                    self.reply(h.unique, &Reply::Error(libc::EINVAL));
                    continue;
                }
            };
            self.served += 1;
            match dispatch(&self.state, &req) {
                Action::Reply(r) => self.reply(req.header.unique, &r),
                Action::Submit {
                    mut request,
                    pending,
                } => {
                    request.user_data = self.in_flight.insert(req.header.unique, pending);
                    batch.push(request);
                    // An idle disk gets the first request at once, before
                    // the read that finds /dev/fuse empty (at queue depth
                    // 1 that read only delays the I/O); later ones batch.
                    if self.disk.in_flight() == 0 {
                        self.submit(&mut batch);
                    }
                }
            }
        }
        self.submit(&mut batch);
        if self.connection_gone {
            self.gate.close();
        } else if self.helper.is_none() {
            self.gate.note_primary_cpu();
            self.gate.arm_helpers_if_loaded();
        }
    }

    fn submit(&mut self, batch: &mut Vec<BlockRequest>) {
        if batch.is_empty() {
            return;
        }
        self.gate.submitted(batch.len());
        self.disk.submit_batch_requests(batch.drain(..));
        self.peak_in_flight = self.peak_in_flight.max(self.disk.in_flight());
    }

    fn answer_completions(&mut self, completions: &mut Vec<Completion>) {
        self.disk.reap_completions(completions);
        self.gate.completed(completions.len());
        for c in completions.drain(..) {
            match self.in_flight.remove(c.user_data) {
                Some((unique, pending)) => {
                    let reply = pending.reply(unique, c);
                    self.reply(unique, &reply);
                }
                None => log::error!("fuse: completion for unknown request {}", c.user_data),
            }
        }
    }

    fn reply(&self, unique: u64, reply: &Reply) {
        if let Err(e) = write_reply(&self.dev, unique, reply) {
            log::debug!("fuse: reply to request {unique}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::fuse::abi::{opcode, InHeader, ReadWriteIn};
    use std::os::unix::io::FromRawFd;

    fn message(op: u32, unique: u64, arg: &[u8]) -> Vec<u8> {
        let h = InHeader {
            len: (std::mem::size_of::<InHeader>() + arg.len()) as u32,
            opcode: op,
            unique,
            nodeid: 1,
            ..Default::default()
        };
        [h.as_bytes(), arg].concat()
    }

    /// A queue thread on one end of a SOCK_SEQPACKET pair (one message per
    /// read and per write, as /dev/fuse): FUSE_INTERRUPT, well formed or
    /// not, for a request in flight or one nobody knows, gets no reply and
    /// breaks no other reply; a 0-byte read ends the thread.
    #[test]
    fn interrupts_get_no_reply_and_break_no_other() {
        let path = std::env::temp_dir().join(format!("fuse-devq-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let mut options = block::DiskOptions::new(&path);
        options.image_type = block::ImageType::RAW;
        let image = block::ExclusiveImage::open(&options).unwrap();
        let state = Arc::new(ExportState::new(&image, false, false, false));
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two descriptors into `fds`.
        let rc =
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) };
        assert_eq!(rc, 0);
        // SAFETY: both descriptors were just created and are owned here.
        let (ours, kernel) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let gate = Arc::new(ReaderGate::new(0).unwrap());
        let queue = DevQueue::new(
            ours,
            image.disk().queue().unwrap(),
            state,
            Duration::ZERO,
            gate,
            None,
        )
        .unwrap();
        let thread = std::thread::spawn(move || queue.run());
        let read = ReadWriteIn {
            offset: 4096,
            size: 4096,
            ..Default::default()
        };
        let int_bit = 1u64;
        for m in [
            message(opcode::READ, 10, read.as_bytes()),
            // INTERRUPT of the READ in flight.
            message(opcode::INTERRUPT, 12 | int_bit, &10u64.to_ne_bytes()),
            // Without its argument.
            message(opcode::INTERRUPT, 14 | int_bit, &[]),
            // Of a request nobody sent.
            message(opcode::INTERRUPT, 16 | int_bit, &12345u64.to_ne_bytes()),
            message(opcode::GETATTR, 18, &[0; 16]),
        ] {
            (&kernel).write_all(&m).unwrap();
        }
        // SAFETY: shutdown of a descriptor `kernel` owns.
        assert_eq!(unsafe { libc::shutdown(fds[1], libc::SHUT_WR) }, 0);
        thread.join().unwrap().unwrap();
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 1 << 17];
        loop {
            let n = (&kernel).read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            let out = OutHeader::read_from(&buf[..n]).unwrap();
            assert_eq!(out.len as usize, n);
            replies.push((out.unique, out.error, n));
        }
        replies.sort();
        assert_eq!(replies.len(), 2, "{replies:?}");
        assert_eq!(replies[0], (10, 0, 16 + 4096));
        assert_eq!((replies[1].0, replies[1].1), (18, 0));
        std::fs::remove_file(path).unwrap();
    }
}
