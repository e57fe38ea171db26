//! One client: the handshake, then the transmission loop.
//!
//! The loop waits (poll) on the socket, the queue's completion eventfd
//! and the export's stop eventfd, and on each wake-up:
//! 1. reads what the client sent (up to a few buffers), parses it into
//!    requests and hands them to [`Commands`], which fills one batch of
//!    block requests, submitted with one `submit_batch_requests`;
//! 2. drains the queue's completions into replies (FUA flushes join the
//!    next batch), right after a submission too: requests often complete
//!    while they are submitted;
//! 3. sends every reply queued, with one `sendmsg` per batch (leftovers
//!    wait for the socket to become writable).
//!
//! Reading pauses while too much is in flight or too many reply bytes
//! wait for a client that does not read them. A client that breaks the
//! framing, disconnects, or sends DISC, and the export's stop, all end
//! reading; the loop then finishes the requests already submitted (their
//! memory belongs to the queue until they complete), sends their replies
//! if the client still listens, and returns.

use std::io::ErrorKind;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::{BlockRequest, Completion};
use nbd::outbox::{Flushed, Outbox};
use nbd::server::{negotiate_offering_bitmaps, Negotiated, Parsed, RequestParser, Rules};
use nbd::stream::Stream;
use nbd::wire::consts::MAX_PAYLOAD;
use vmm_sys_util::eventfd::EventFd;

use crate::commands::Commands;
use crate::poll::pollfd;
use crate::shared::ExportShared;
use crate::source::SourceQueue;

/// A client has this long for each step of the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes read from the socket per `recv`.
const RECV_BUF: usize = 256 << 10;
/// `recv` calls per wake-up before the loop answers what it has.
const RECVS_PER_WAKE: usize = 4;
/// Reading pauses at this many requests in flight...
const MAX_IN_FLIGHT: usize = 1024;
/// ... or at this many reply bytes the client has not taken.
const MAX_UNSENT: usize = 64 << 20;
/// After reading ends, unsent replies get this long to leave.
const LINGER: Duration = Duration::from_secs(5);

fn peer(s: &Stream) -> String {
    match s {
        Stream::Unix(_) => "a unix client".to_string(),
        Stream::Tcp(t) => t
            .peer_addr()
            .map_or("a tcp client".into(), |a| a.to_string()),
    }
}

/// Serves one client until it leaves or the export stops, then shuts
/// the socket down (the accept thread holds a second handle on it, which
/// must not keep the client waiting).
pub fn serve(stream: Stream, shared: &Arc<ExportShared>, stop: &EventFd) {
    let closer = stream.try_clone();
    serve_until_done(stream, shared, stop);
    if let Ok(s) = closer {
        s.shutdown();
    }
}

fn serve_until_done(mut stream: Stream, shared: &Arc<ExportShared>, stop: &EventFd) {
    let who = peer(&stream);
    if let Err(e) = stream.set_timeouts(Some(HANDSHAKE_TIMEOUT)) {
        log::warn!("nbd: {who}: {e}");
        return;
    }
    let session = match negotiate_offering_bitmaps(&mut stream, &shared.desc, &shared.bitmap_names)
    {
        Ok(Negotiated::Go(s)) => s,
        Ok(Negotiated::Aborted) => {
            log::debug!("nbd: {who} ended the handshake");
            return;
        }
        Err(e) => {
            log::warn!(
                "nbd: handshake with {who} failed: {}",
                ch_log::error_chain(&e)
            );
            return;
        }
    };
    if let Err(e) = stream
        .set_timeouts(None)
        .and_then(|()| stream.set_nonblocking(true))
    {
        log::warn!("nbd: {who}: {e}");
        return;
    }
    let queue = match shared.source.queue() {
        Ok(q) => q,
        Err(e) => {
            log::error!("nbd: no queue for {who}: {}", ch_log::error_chain(&e));
            return;
        }
    };
    log::debug!(
        "nbd: {who} connected (structured replies: {}, meta contexts: {})",
        session.structured,
        session.contexts().len()
    );
    let rules = Rules {
        size: shared.desc.size,
        writable: shared.writable,
        structured: session.structured,
        block_status: session.block_status(),
        max_payload: MAX_PAYLOAD,
    };
    let mut t = Transmission {
        stream,
        queue,
        parser: RequestParser::new(rules),
        commands: Commands::new(shared.clone(), session.structured, session.contexts()),
        out: Outbox::new(),
        buf: vec![0; RECV_BUF],
        batch: Vec::new(),
        parsed: Vec::new(),
        completions: Vec::new(),
        reading: true,
        writing: true,
        closed_at: None,
        who,
    };
    t.run(stop);
    log::debug!("nbd: {} disconnected", t.who);
}

struct Transmission {
    stream: Stream,
    queue: Box<dyn SourceQueue>,
    parser: RequestParser,
    commands: Commands,
    out: Outbox,
    buf: Vec<u8>,
    batch: Vec<BlockRequest>,
    parsed: Vec<Parsed>,
    completions: Vec<Completion>,
    /// Still taking requests.
    reading: bool,
    /// Still sending replies (false once the client is gone or broke
    /// the protocol).
    writing: bool,
    /// When reading ended.
    closed_at: Option<Instant>,
    who: String,
}

impl Transmission {
    fn run(&mut self, stop: &EventFd) {
        loop {
            let unsent = self.writing && !self.out.is_empty();
            if !self.reading && self.commands.in_flight() == 0 {
                let lingered = self.closed_at.is_some_and(|t| t.elapsed() > LINGER);
                if !unsent || lingered {
                    return;
                }
            }
            let take = self.reading
                && self.commands.in_flight() < MAX_IN_FLIGHT
                && self.out.pending() < MAX_UNSENT;
            let mut sock = pollfd(self.stream.as_fd().as_raw_fd());
            sock.events =
                (if take { libc::POLLIN } else { 0 }) | (if unsent { libc::POLLOUT } else { 0 });
            let mut fds = [
                sock,
                pollfd(self.queue.completion_fd()),
                pollfd(if self.reading { stop.as_raw_fd() } else { -1 }),
            ];
            let timeout = if self.reading { -1 } else { 100 };
            // SAFETY: `fds` is an array of valid pollfds for the call.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
            if r < 0 {
                continue;
            }
            if fds[2].revents != 0 {
                log::debug!("nbd: {}: the export stops", self.who);
                self.end_reading();
            }
            if fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && take {
                self.receive();
            }
            let submitted = !self.batch.is_empty();
            if submitted {
                self.queue.submit(&mut self.batch);
            }
            // Requests often complete during their submission (buffered
            // reads, inline work): answer them now rather than after one
            // more trip through poll.
            if fds[1].revents != 0 || submitted {
                self.complete();
            }
            self.send();
        }
    }

    fn end_reading(&mut self) {
        if self.reading {
            self.reading = false;
            self.closed_at = Some(Instant::now());
        }
    }

    /// Reads and parses what the client sent.
    fn receive(&mut self) {
        for _ in 0..RECVS_PER_WAKE {
            // SAFETY: `buf` is a valid writable buffer of its length.
            let n = unsafe {
                libc::recv(
                    self.stream.as_fd().as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    ErrorKind::WouldBlock => break,
                    ErrorKind::Interrupted => continue,
                    _ => {
                        log::debug!("nbd: {}: {e}", self.who);
                        self.writing = false;
                        self.end_reading();
                        break;
                    }
                }
            }
            if n == 0 {
                if !self.parser.is_idle() {
                    log::warn!(
                        "nbd: {} closed the connection in the middle of a request",
                        self.who
                    );
                }
                self.end_reading();
                break;
            }
            let input = &self.buf[..n as usize];
            if let Err(e) = self.parser.feed(input, &mut self.parsed) {
                log::warn!(
                    "nbd: {} broke the protocol ({e}); closing the connection",
                    self.who
                );
                self.writing = false;
                self.end_reading();
            }
            for p in std::mem::take(&mut self.parsed) {
                match p {
                    Parsed::Request(req) => {
                        self.commands
                            .on_request(req, &mut self.batch, &mut self.out)
                    }
                    Parsed::Reject {
                        cookie,
                        error,
                        reason,
                        close,
                    } => {
                        self.commands.reject(&mut self.out, cookie, error, &reason);
                        if close {
                            log::warn!("nbd: {}: {reason}; closing the connection", self.who);
                            self.end_reading();
                        }
                    }
                    Parsed::Disconnect => self.end_reading(),
                }
            }
            if !self.reading || (n as usize) < self.buf.len() {
                break;
            }
        }
    }

    fn complete(&mut self) {
        self.queue.drain_completions(&mut self.completions);
        for c in self.completions.drain(..) {
            self.commands
                .on_completion(c, &mut self.batch, &mut self.out);
        }
        if !self.batch.is_empty() {
            self.queue.submit(&mut self.batch);
        }
    }

    fn send(&mut self) {
        if !self.writing {
            self.out.clear();
            return;
        }
        match self.out.flush(self.stream.as_fd()) {
            Ok(Flushed::All | Flushed::Blocked) => {}
            Err(e) => {
                log::debug!("nbd: {}: sending replies: {e}", self.who);
                self.writing = false;
                self.out.clear();
                self.end_reading();
            }
        }
    }
}
