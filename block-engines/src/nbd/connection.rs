//! One NBD connection, shared by whoever submits to it (queues, blocking
//! callers), and the thread that reads its replies.
//!
//! Submitting (any thread) takes the state lock, tables the operation's
//! commands ([`Inflight`]), encodes them into the send queue and, on
//! [`Connection::flush`], sends the queue with one non-blocking
//! `sendmsg`; what the socket does not take, the connection's thread
//! sends when it becomes writable. The thread ([`super::io_thread`])
//! waits on the socket, parses replies, copies READ data into the
//! requests' memory and completes operations to their sinks; it also
//! reconnects when the server goes away.
//!
//! The link's states follow QEMU's `reconnect-delay`:
//! - `Up`: commands go out as they come;
//! - `Waiting` (lost, `reconnect_delay` > 0, until the delay ends):
//!   commands in flight and new ones wait and are sent again on the new
//!   connection;
//! - `Failing` (lost, no delay or the delay ran out): everything fails
//!   with EIO at once while the thread keeps trying to reconnect;
//! - `Closed` (the server broke the protocol, or we shut down): every
//!   command fails, for good.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nbd::client::{connect, ConnectError, ExportInfo, ReplyParser};
use nbd::outbox::{Flushed, Outbox};
use nbd::stream::Stream;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::inflight::{Inflight, OpRequest};
use super::link::{Link, Shared, State, Target, CONNECT_TIMEOUT};

/// A connection and its thread; dropping it disconnects.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Connection {
    /// Connects, negotiates and starts the connection's thread.
    pub fn open(target: Target) -> Result<Connection, ConnectError> {
        let (stream, info) = connect(&target.uri, &target.cfg, CONNECT_TIMEOUT)?;
        Self::with_stream(target, stream, info)
    }

    pub fn with_stream(
        target: Target,
        stream: Stream,
        info: ExportInfo,
    ) -> Result<Connection, ConnectError> {
        let addr = target.uri.to_string();
        let io_err = |source| ConnectError::Connect {
            addr: addr.clone(),
            source,
        };
        stream.set_nonblocking(true).map_err(io_err)?;
        let kick = EventFd::new(EFD_NONBLOCK).map_err(io_err)?;
        let inflight = Inflight::new(info.base_allocation);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                link: Link::Up(stream),
                parser: ReplyParser::new(info.structured),
                info,
                out: Outbox::new(),
                inflight,
                shutdown: false,
            }),
            kick,
            target,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nbd-client".into())
            .spawn(move || super::io_thread::run(&s))
            .map_err(io_err)?;
        Ok(Connection {
            shared,
            thread: Some(thread),
        })
    }

    pub fn info(&self) -> ExportInfo {
        self.shared.lock().info.clone()
    }

    /// Starts an operation; it completes to its sink, also when it fails.
    pub fn submit(&self, r: OpRequest) {
        let mut st = self.shared.lock();
        let st = &mut *st;
        match st.link {
            Link::Up(_) | Link::Waiting { .. } => {
                let max = st.info.max_payload();
                let cookies = st.inflight.add(r, max);
                if let Link::Up(_) = st.link {
                    for c in cookies {
                        st.inflight.encode(c, &mut st.out);
                    }
                }
            }
            Link::Failing | Link::Closed => {
                let errno = if st.shutdown {
                    libc::ESHUTDOWN
                } else {
                    libc::EIO
                };
                let cookies = st.inflight.add(r, st.info.max_payload());
                st.inflight.fail_cmds(&cookies, errno);
            }
        }
    }

    /// Sends what was submitted; what the socket does not take now, the
    /// connection's thread sends later.
    pub fn flush(&self) {
        let mut st = self.shared.lock();
        let st = &mut *st;
        if st.out.is_empty() {
            return;
        }
        let Link::Up(stream) = &st.link else {
            return;
        };
        match st.out.flush(stream.as_fd()) {
            Ok(Flushed::All) => {}
            // The thread waits for the socket (or notices the error).
            Ok(Flushed::Blocked) | Err(_) => self.shared.kick(),
        }
    }

    /// Forgets the operations of `sink` (its owner is going away with
    /// operations still in flight).
    pub fn forget(&self, sink: &super::sink::Sink) {
        self.shared.lock().inflight.forget(sink);
    }
}

impl Drop for Connection {
    /// Sends a courtesy DISC, stops the thread and closes the socket.
    /// Only `sendmsg`, eventfd writes, futexes and `close` here: the VMM
    /// drops disks on a thread whose seccomp filter allows no more.
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.shutdown = true;
            if let Link::Up(stream) = &st.link {
                let mut out = Outbox::new();
                out.push_with(|b| {
                    nbd::wire::RequestHeader::new(nbd::wire::consts::cmd::DISC, 0, 0, 0, 0)
                        .encode(b)
                });
                let _ = out.flush(stream.as_fd());
            }
            st.out.clear();
            st.inflight.fail_all(libc::ESHUTDOWN);
        }
        self.shared.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Closes the socket (the thread no longer uses it).
        self.shared.lock().link = Link::Closed;
    }
}
