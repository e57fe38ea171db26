//! The thread of one NBD connection: receives and parses replies, sends
//! what the submitters could not, and reconnects.
//!
//! While the link is up it waits (poll) on the socket and its kick
//! eventfd, receives into its own buffer without the state lock, then
//! feeds the bytes to the reply parser under the lock (READ data is
//! copied into the requests' memory there, and finished operations
//! complete to their sinks). A server that closes the connection or an
//! I/O error is a lost connection (reconnect as [`super::connection`]
//! describes); a reply that breaks the protocol closes it for good, as
//! QEMU's client does.
//!
//! While the link is down it tries to connect again: at once, then after
//! 1, 2, 4, 8 and 16 seconds, then every 16 seconds (QEMU's connect
//! thread's back-off), and ends the wait of the requests when the
//! reconnect delay is over. A new connection must show the same export
//! (size, read-only flag); then every command in flight is sent again.
//!
//! What the operator sees (warnings, so the VMM's default level shows
//! them): the loss with its reason; each failed attempt with its reason,
//! the first one and then whenever the reason changes or a minute has
//! passed; and the reconnection, with how long the export was away.

use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use nbd::client::{connect, ExportInfo, ReplyParser};

use super::link::{Link, Shared, State, CONNECT_TIMEOUT};

/// Bytes received per `recv`.
const RECV_BUF: usize = 256 << 10;
/// Longest pause between reconnection attempts (QEMU's).
const MAX_BACKOFF: Duration = Duration::from_secs(16);
/// A failed attempt whose reason did not change is logged again after
/// this long.
const REPEAT_FAILURE_LOG: Duration = Duration::from_secs(60);

/// One time the export was away: since when, and the failed attempts
/// to get it back (for the log lines).
struct Outage {
    since: Instant,
    attempts: u32,
    last_logged: Option<(Instant, String)>,
}

impl Outage {
    fn new() -> Self {
        Outage {
            since: Instant::now(),
            attempts: 0,
            last_logged: None,
        }
    }

    /// Logs a failed attempt, unless the same reason was logged less
    /// than a minute ago.
    fn failed(&mut self, uri: &impl std::fmt::Display, reason: String) {
        self.attempts += 1;
        let now = Instant::now();
        let repeat = self.last_logged.as_ref().is_some_and(|(at, why)| {
            *why == reason && now.duration_since(*at) < REPEAT_FAILURE_LOG
        });
        if !repeat {
            log::warn!(
                "nbd: {uri}: reconnect attempt {} failed after {:.1} s away: {reason}",
                self.attempts,
                self.since.elapsed().as_secs_f64()
            );
            self.last_logged = Some((now, reason));
        }
    }
}

pub(crate) fn run(shared: &Shared) {
    let mut buf = vec![0u8; RECV_BUF];
    let mut backoff = Duration::ZERO;
    let mut outage: Option<Outage> = None;
    loop {
        let (fd, want_out) = {
            let st = shared.lock();
            if st.shutdown {
                return;
            }
            match &st.link {
                Link::Up(s) => (s.as_fd().as_raw_fd(), !st.out.is_empty()),
                Link::Closed => return,
                Link::Waiting { .. } | Link::Failing => (-1, false),
            }
        };
        if fd < 0 {
            reconnect(shared, &mut backoff, outage.get_or_insert_with(Outage::new));
            continue;
        }
        outage = None;
        backoff = Duration::ZERO;
        let mut fds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN | if want_out { libc::POLLOUT } else { 0 },
                revents: 0,
            },
            libc::pollfd {
                fd: shared.kick.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is an array of valid pollfds for the call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 {
            continue;
        }
        if fds[1].revents != 0 {
            let _ = shared.kick.read();
        }
        if fds[0].revents & libc::POLLOUT != 0 {
            let mut st = shared.lock();
            let st = &mut *st;
            if let Link::Up(s) = &st.link {
                if let Err(e) = st.out.flush(s.as_fd()) {
                    lost(shared, st, &format!("sending: {e}"));
                    continue;
                }
            }
        }
        if fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            receive(shared, fd, &mut buf);
        }
    }
}

/// Receives what is there and parses it.
fn receive(shared: &Shared, fd: i32, buf: &mut [u8]) {
    // SAFETY: `buf` is a valid writable buffer of its length; `fd` stays
    // open: only this thread replaces or closes the stream.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    let mut st = shared.lock();
    let st = &mut *st;
    if st.shutdown {
        return;
    }
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ) {
            lost(shared, st, &format!("receiving: {e}"));
        }
        return;
    }
    if n == 0 {
        lost(shared, st, "the server closed the connection");
        return;
    }
    // The parser asks about cookies and reports events in turn, never
    // both at once: one table serves both closures.
    let inflight = std::cell::RefCell::new(&mut st.inflight);
    let parsed = st.parser.feed(
        &buf[..n as usize],
        &mut |cookie| inflight.borrow().expect(cookie),
        &mut |ev| inflight.borrow_mut().on_event(ev),
    );
    if let Err(e) = parsed {
        broken(st, &shared.target.uri, &e.to_string());
    }
}

/// A connection lost to an I/O error or a hang-up: reconnect, with the
/// requests waiting or failing as the reconnect delay says.
pub(crate) fn lost(shared: &Shared, st: &mut State, why: &str) {
    if let Link::Up(s) = &st.link {
        s.shutdown();
    }
    st.out.clear();
    st.parser = ReplyParser::new(st.info.structured);
    let uri = &shared.target.uri;
    let delay = shared.target.reconnect_delay;
    if delay.is_zero() {
        log::warn!("nbd: {uri}: connection lost ({why}); requests fail until it is back");
        st.link = Link::Failing;
        st.inflight.fail_all(libc::EIO);
    } else {
        log::warn!(
            "nbd: {uri}: connection lost ({why}); requests wait up to {}s for a new one",
            delay.as_secs()
        );
        st.link = Link::Waiting {
            until: Instant::now() + delay,
        };
    }
}

/// The server broke the protocol: close for good.
fn broken(st: &mut State, uri: &nbd::client::NbdUri, why: &str) {
    log::error!("nbd: {uri}: the server broke the protocol ({why}); closing the connection");
    if let Link::Up(s) = &st.link {
        s.shutdown();
    }
    st.link = Link::Closed;
    st.out.clear();
    st.inflight.fail_all(libc::EIO);
}

/// Whether a new connection shows the export we had.
fn same_export(old: &ExportInfo, new: &ExportInfo) -> Result<(), String> {
    if old.size != new.size {
        return Err(format!(
            "its size changed from {} to {}",
            old.size, new.size
        ));
    }
    if new.read_only() && !old.read_only() {
        return Err("it became read-only".into());
    }
    Ok(())
}

/// One attempt to reconnect, then a pause (cut short by the end of the
/// reconnect delay or a shutdown).
fn reconnect(shared: &Shared, backoff: &mut Duration, outage: &mut Outage) {
    let uri = &shared.target.uri;
    let attempt = connect(uri, &shared.target.cfg, CONNECT_TIMEOUT);
    let mut guard = shared.lock();
    let st = &mut *guard;
    if st.shutdown {
        return;
    }
    match attempt {
        Ok((stream, info)) => match same_export(&st.info, &info) {
            Ok(()) if stream.set_nonblocking(true).is_ok() => {
                st.parser = ReplyParser::new(info.structured);
                st.inflight.context = info.base_allocation;
                st.info = info;
                st.out.clear();
                let resent = st.inflight.encode_all(&mut st.out);
                st.link = Link::Up(stream);
                log::warn!(
                    "nbd: {uri}: reconnected after {:.1} s away ({} failed attempt{}); {resent} command{} sent again",
                    outage.since.elapsed().as_secs_f64(),
                    outage.attempts,
                    if outage.attempts == 1 { "" } else { "s" },
                    if resent == 1 { "" } else { "s" },
                );
                *backoff = Duration::ZERO;
                return;
            }
            Ok(()) => outage.failed(uri, "cannot make the new socket non-blocking".into()),
            Err(why) => {
                log::error!(
                    "nbd: {uri}: the new connection shows another export ({why}); giving up"
                );
                st.link = Link::Closed;
                st.inflight.fail_all(libc::EIO);
                return;
            }
        },
        Err(e) => outage.failed(uri, ch_log::error_chain(&e)),
    }
    *backoff = if backoff.is_zero() {
        Duration::from_secs(1)
    } else {
        (*backoff * 2).min(MAX_BACKOFF)
    };
    let mut pause = *backoff;
    if let Link::Waiting { until } = st.link {
        let now = Instant::now();
        if now >= until {
            log::warn!("nbd: {uri}: no new connection within the reconnect delay; requests fail until it is back");
            st.link = Link::Failing;
            st.inflight.fail_all(libc::EIO);
        } else {
            pause = pause.min(until - now);
        }
    }
    drop(guard);
    let mut fd = libc::pollfd {
        fd: shared.kick.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `fd` is one valid pollfd for the call.
    unsafe { libc::poll(&mut fd, 1, pause.as_millis().min(i32::MAX as u128) as i32) };
    let _ = shared.kick.read();
}
