//! The export's listening socket and its connection loop.
//!
//! [`VhostUserBlkExport::start`] binds the socket (refusing a path that
//! exists) and starts one thread that serves front ends one after
//! another: for each connection it builds a fresh [`BlockDevice`] (so
//! features, WCE and queue state start clean) inside a fresh
//! [`BlkBackend`] and vhost-user-backend daemon, and waits until the
//! front end goes away or sends something the library refuses (logged).
//! Then [`BlkBackend::disconnect`] drains and flushes, and the thread
//! accepts the next connection. [`Export::stop`] ends the connection in
//! progress, wakes the accept, joins the thread and removes the socket.

use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use block::Disk;
use log::{error, info, warn};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{Error as DaemonError, ShutdownHandle, VhostUserDaemon};
use virtio_devices::block::{BlockDevice, BlockDeviceConfig};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use super::backend::BlkBackend;
use crate::export::running::{Export, ExportError};

/// What the connection thread and [`Export::stop`] share.
#[derive(Default)]
struct StopSignal {
    stopping: AtomicBool,
    /// The connection in progress, to end it on stop.
    connection: Mutex<Option<ShutdownHandle>>,
}

impl StopSignal {
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Marks the export stopping and ends the connection in progress.
    fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        let slot = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = slot.as_ref() {
            h.shutdown();
        }
    }

    fn set_connection(&self, handle: Option<ShutdownHandle>) {
        let mut slot = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        *slot = handle;
        // A stop that came before the handle was stored ends it now.
        if self.stopping() {
            if let Some(h) = slot.as_ref() {
                h.shutdown();
            }
        }
    }
}

/// A running vhost-user-blk export.
pub struct VhostUserBlkExport {
    socket: PathBuf,
    description: String,
    /// A second handle on the listening socket, to wake the accept.
    listener: UnixListener,
    signal: Arc<StopSignal>,
    thread: Option<JoinHandle<()>>,
}

impl VhostUserBlkExport {
    /// Binds `socket` and starts serving front ends with devices built
    /// from `config` over `disk`.
    pub fn start(
        disk: &Disk,
        socket: &Path,
        config: BlockDeviceConfig,
    ) -> Result<Self, ExportError> {
        let fail = |reason: String| ExportError::VhostUserBlk {
            socket: socket.display().to_string(),
            reason,
        };
        // The configuration is checked once here, not per connection.
        BlockDevice::new(disk.clone(), config.clone()).map_err(|e| fail(e.to_string()))?;
        if std::fs::symlink_metadata(socket).is_ok() {
            return Err(fail("the path already exists".into()));
        }
        let listener =
            UnixListener::bind(socket).map_err(|e| fail(format!("cannot create socket: {e}")))?;
        let waker = listener
            .try_clone()
            .map_err(|e| fail(format!("cannot duplicate the socket: {e}")))?;
        let signal = Arc::new(StopSignal::default());
        let description = format!(
            "vhost-user-blk on {} ({} queue(s) of {}, {})",
            socket.display(),
            config.num_queues,
            config.queue_size,
            if config.readonly {
                "read-only"
            } else {
                "writable"
            }
        );
        let serve_signal = Arc::clone(&signal);
        let serve_disk = disk.clone();
        let thread = std::thread::Builder::new()
            .name("vhost-user-blk".into())
            .spawn(move || {
                serve_connections(Listener::from(listener), serve_disk, config, serve_signal)
            })
            .map_err(|e| fail(format!("cannot start the connection thread: {e}")));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                let _ = std::fs::remove_file(socket);
                return Err(e);
            }
        };
        Ok(VhostUserBlkExport {
            socket: socket.to_path_buf(),
            description,
            listener: waker,
            signal,
            thread: Some(thread),
        })
    }
}

/// Serves one front end at a time until stopped.
fn serve_connections(
    mut listener: Listener,
    disk: Disk,
    config: BlockDeviceConfig,
    signal: Arc<StopSignal>,
) {
    while !signal.stopping() {
        let device = match BlockDevice::new(disk.clone(), config.clone()) {
            Ok(d) => d,
            Err(e) => {
                error!("vhost-user-blk: cannot create the device: {e}");
                return;
            }
        };
        let backend = Arc::new(BlkBackend::new(device, disk.clone()));
        let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon = match VhostUserDaemon::new(
            "vhost-user-blk-conn".into(),
            Arc::clone(&backend),
            memory,
        ) {
            Ok(d) => d,
            Err(e) => {
                error!("vhost-user-blk: cannot set up for a connection: {e}");
                return;
            }
        };
        if let Err(e) = daemon.start(&mut listener) {
            backend.disconnect();
            if signal.stopping() {
                return;
            }
            error!("vhost-user-blk: accept: {e}");
            // A persistent accept error would otherwise spin.
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        info!("vhost-user-blk: front end connected");
        signal.set_connection(daemon.shutdown_handle());
        match daemon.wait() {
            Ok(()) => info!("vhost-user-blk: front end disconnected"),
            Err(DaemonError::HandleRequest(
                VhostUserError::Disconnected | VhostUserError::PartialMessage,
            )) => info!("vhost-user-blk: front end disconnected"),
            Err(e) => warn!("vhost-user-blk: connection closed: {e}"),
        }
        signal.set_connection(None);
        backend.disconnect();
    }
}

impl Export for VhostUserBlkExport {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn stop(mut self: Box<Self>) -> Result<(), ExportError> {
        self.signal.stop();
        // Wakes a thread blocked in accept (it then fails with EINVAL).
        // SAFETY: the fd is a socket this export owns; shutdown does not
        // touch memory.
        let rc = unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if rc != 0 {
            warn!(
                "vhost-user-blk: cannot wake the accept: {}",
                std::io::Error::last_os_error()
            );
        }
        let joined = self.thread.take().map(JoinHandle::join);
        let _ = std::fs::remove_file(&self.socket);
        match joined {
            Some(Err(_)) => Err(ExportError::VhostUserBlk {
                socket: self.socket.display().to_string(),
                reason: "the connection thread panicked".into(),
            }),
            _ => Ok(()),
        }
    }
}
