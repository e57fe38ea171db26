//! The classic transport: one thread per /dev/fuse descriptor (the
//! session's and its FUSE_DEV_IOC_CLONE copies), each with its own
//! [`DiskQueue`].
//!
//! The thread waits in epoll on two things: its non-blocking /dev/fuse
//! descriptor and its disk queue's completion eventfd. Readable /dev/fuse:
//! it reads every request there is, answers what needs no I/O at once and
//! submits the rest as one batch of block requests. Readable eventfd: it
//! drains the completions and writes their replies. So reading never
//! waits for image I/O. The thread ends when the connection is gone
//! (ENODEV, after the unmount or an abort) and nothing is in flight.

use std::fs::File;
use std::io::{IoSlice, Read, Write};
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

use block::{BlockRequest, Completion, DiskQueue};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::abi::{OutHeader, Pod};
use super::attr::ExportState;
use super::handler::{dispatch, Action, FuseRequest, ParseError, Pending, Reply};
use super::init::DEV_BUFFER_SIZE;

const FUSE_EVENT: u64 = 0;
const COMPLETION_EVENT: u64 = 1;

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
}

impl DevQueue {
    /// `dev` is switched to non-blocking here.
    pub fn new(dev: File, disk: DiskQueue, state: Arc<ExportState>) -> std::io::Result<Self> {
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
        })
    }

    /// Serves requests until the connection is gone and every request in
    /// flight has been answered.
    pub fn run(mut self) -> std::io::Result<()> {
        let epoll = Epoll::new()?;
        // Every clone of the session descriptor waits on the same kernel
        // queue: EXCLUSIVE wakes one queue thread per request instead of
        // all of them (the others would only read EAGAIN). The end of the
        // connection still wakes every thread.
        epoll.ctl(
            ControlOperation::Add,
            self.dev.as_raw_fd(),
            EpollEvent::new(EventSet::IN | EventSet::EXCLUSIVE, FUSE_EVENT),
        )?;
        epoll.ctl(
            ControlOperation::Add,
            self.disk.completion_eventfd().as_raw_fd(),
            EpollEvent::new(EventSet::IN, COMPLETION_EVENT),
        )?;
        let mut buf = vec![0u8; DEV_BUFFER_SIZE];
        let mut events = vec![EpollEvent::default(); 2];
        let mut completions = Vec::new();
        while !(self.connection_gone && self.disk.in_flight() == 0) {
            self.waits += 1;
            self.in_flight_at_waits += self.disk.in_flight() as u64;
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                match ev.data() {
                    FUSE_EVENT if self.connection_gone => {
                        // Stop watching a dead descriptor (it stays readable).
                        let _ = epoll.ctl(ControlOperation::Delete, self.dev.as_raw_fd(), *ev);
                    }
                    FUSE_EVENT => self.read_requests(&mut buf),
                    _ => self.answer_completions(&mut completions),
                }
            }
        }
        log::info!(
            "fuse /dev/fuse queue {}: served {} requests, at most {} in flight, {} waits, {:.1} in flight at a wait on average",
            std::thread::current().name().unwrap_or("?"),
            self.served,
            self.peak_in_flight,
            self.waits,
            self.in_flight_at_waits as f64 / self.waits.max(1) as f64
        );
        Ok(())
    }

    /// Reads until /dev/fuse is empty, then submits the batch.
    fn read_requests(&mut self, buf: &mut [u8]) {
        let mut batch: Vec<BlockRequest> = Vec::new();
        loop {
            let n = match (&self.dev).read(buf) {
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
                }
            }
        }
        if !batch.is_empty() {
            self.disk.submit_batch_requests(batch);
            self.peak_in_flight = self.peak_in_flight.max(self.disk.in_flight());
        }
    }

    fn answer_completions(&mut self, completions: &mut Vec<Completion>) {
        self.disk.drain_completions(completions);
        for c in completions.drain(..) {
            match self.in_flight.remove(c.user_data) {
                Some((unique, pending)) => {
                    let reply = pending.reply(c);
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
