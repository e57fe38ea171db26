//! Where NBD connections are opened: on the calling thread, or, once the
//! program has started one ([`start_connector`]), on the process's
//! connector thread.
//!
//! A program that confines its threads with seccomp (the VMM) cannot let
//! every thread that may open an export create sockets: an export is
//! opened by whoever opens its image (the VMM's control loop for a
//! hot-added disk, `vm.disk-info` reading a backing chain) and gets more
//! connections from whoever creates queues (a vCPU's activation thread,
//! for multi-conn servers). Such a program starts the connector before it
//! installs any filter, and gives it a set-up step that installs the one
//! filter that allows sockets. Every connection of the process is then
//! opened there: an export's first one, each queue's own, and, since a
//! connection's reply thread is created by the thread that opens the
//! connection and inherits its filter, every reconnection too.
//!
//! Without a connector (`ch-img`, the storage daemon, tests), a
//! connection is opened on the thread that asks for it.
//!
//! Enters as a [`Target`]; leaves as a [`Connection`] or the reason it
//! could not be opened. The connector serves one request at a time; a
//! request waits for the ones before it (each gives up after
//! [`super::link::CONNECT_TIMEOUT`] per step).

use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

use nbd::client::ConnectError;

use super::connection::Connection;
use super::link::Target;

type Reply = Sender<Result<Connection, ConnectError>>;

/// The connector's request queue, once started.
static CONNECTOR: OnceLock<Sender<(Target, Reply)>> = OnceLock::new();

/// Starts the process's connector thread: it runs `setup` first (the
/// VMM installs its seccomp filter there), then opens every NBD
/// connection of the process until the process ends. Fails if `setup`
/// fails (its message comes back) or a connector runs already.
pub fn start_connector(
    setup: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> std::io::Result<()> {
    if CONNECTOR.get().is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "the NBD connector thread runs already",
        ));
    }
    let (jobs, queue) = channel::<(Target, Reply)>();
    let (ready_tx, ready) = channel::<Result<(), String>>();
    std::thread::Builder::new()
        .name("nbd-connector".into())
        .spawn(move || {
            let r = setup();
            let ok = r.is_ok();
            let _ = ready_tx.send(r);
            if !ok {
                return;
            }
            for (target, reply) in queue {
                let _ = reply.send(Connection::open(target));
            }
        })?;
    match ready.recv() {
        Ok(Ok(())) => {}
        Ok(Err(why)) => return Err(std::io::Error::other(why)),
        Err(_) => return Err(std::io::Error::other("the NBD connector thread died")),
    }
    CONNECTOR.set(jobs).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "the NBD connector thread runs already",
        )
    })
}

/// Opens a connection to `target` on the connector thread if there is
/// one, else on the calling thread.
pub(crate) fn open(target: Target) -> Result<Connection, ConnectError> {
    let Some(jobs) = CONNECTOR.get() else {
        return Connection::open(target);
    };
    let addr = target.uri.to_string();
    let (tx, rx) = channel();
    let sent = jobs.send((target, tx));
    let gone = || ConnectError::Connect {
        addr: addr.clone(),
        source: std::io::Error::other("the NBD connector thread is gone"),
    };
    if sent.is_err() {
        return Err(gone());
    }
    rx.recv().unwrap_or_else(|_| Err(gone()))
}
