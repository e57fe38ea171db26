//! The state one NBD connection shares between its submitters and its
//! thread: where the export is ([`Target`]), the link's state ([`Link`],
//! whose states [`super::connection`] describes), and everything behind
//! the connection's lock ([`State`]: the send queue, the commands in
//! flight, the reply parser), with the eventfd that wakes the thread
//! ([`Shared`]).
//!
//! `connection` creates it and submits through it; `io_thread` receives,
//! sends and reconnects through it.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nbd::client::{ClientConfig, ExportInfo, NbdUri, ReplyParser};
use nbd::outbox::Outbox;
use nbd::stream::Stream;
use vmm_sys_util::eventfd::EventFd;

use super::inflight::Inflight;

/// Every step of connecting and the handshake gives up after this long.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the export, and what to do when it goes away.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub uri: NbdUri,
    pub cfg: ClientConfig,
    /// QEMU's `reconnect-delay`: how long requests wait for a new
    /// connection after the server went away (zero: they fail at once).
    pub reconnect_delay: Duration,
}

pub(crate) enum Link {
    Up(Stream),
    Waiting { until: Instant },
    Failing,
    Closed,
}

pub(crate) struct State {
    pub link: Link,
    pub info: ExportInfo,
    pub out: Outbox,
    pub inflight: Inflight,
    pub parser: ReplyParser,
    pub shutdown: bool,
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
    /// Wakes the connection's thread (bytes to send, shutdown).
    pub kick: EventFd,
    pub target: Target,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn kick(&self) {
        let _ = self.kick.write(1);
    }
}
