//! The export's socket and its accept thread.
//!
//! `addr=unix:PATH` (a new socket file, removed at stop) or
//! `addr=tcp:HOST:PORT` (`tcp:[V6]:PORT`; port 10809 when left out). The
//! accept thread waits on the listening socket and the stop eventfd, and
//! starts one thread per client (`crate::connection::serve`); at the
//! connection limit it stops accepting, as QEMU does, so further clients
//! wait in the backlog until one leaves. At stop it shuts the read side
//! of every client socket down (handshakes end, transmission loops stop
//! reading and finish what they have in flight) and joins every thread.

use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use nbd::stream::Stream;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::addr::ListenAddr;
use crate::poll::pollfd;
use crate::shared::ExportShared;

enum Socket {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Socket {
    fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Socket::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
            Socket::Tcp(l) => l.accept().and_then(|(s, _)| {
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }),
        }
    }

    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Unix(l) => l.as_fd(),
            Socket::Tcp(l) => l.as_fd(),
        }
    }
}

/// The listening socket and its accept thread; stopped by
/// [`Listener::stop`] or when dropped.
pub struct Listener {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    /// Where it listens (the bound port for `tcp:...:0`).
    bound: ListenAddr,
    unix_path: Option<PathBuf>,
}

/// A socket bound and listening, not accepting yet: clients that
/// connect wait in the backlog until [`Bound::start`]. Dropped unstarted,
/// it removes its socket file.
pub struct Bound {
    socket: Option<Socket>,
    bound: ListenAddr,
    unix_path: Option<PathBuf>,
}

impl Bound {
    /// Where clients connect (the bound port for `tcp:...:0`).
    pub fn bound(&self) -> &ListenAddr {
        &self.bound
    }

    /// Starts the accept thread.
    pub fn start(
        mut self,
        shared: Arc<ExportShared>,
        max_connections: u32,
    ) -> Result<Listener, String> {
        let socket = self.socket.take().expect("a bound socket until started");
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?);
        let left = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?);
        // From here on the listener owns the socket file: a failure must
        // not leave it behind.
        let mut listener = Listener {
            stop,
            thread: None,
            bound: self.bound.clone(),
            unix_path: self.unix_path.take(),
        };
        let nonblocking = match &socket {
            Socket::Unix(l) => l.set_nonblocking(true),
            Socket::Tcp(l) => l.set_nonblocking(true),
        };
        nonblocking.map_err(|e| e.to_string())?;
        let accept = Acceptor {
            socket,
            shared,
            stop: listener.stop.clone(),
            left,
            max: max_connections as usize,
            clients: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept.run())
            .map_err(|e| e.to_string())?;
        listener.thread = Some(thread);
        Ok(listener)
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(p) = self.unix_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Listener {
    /// Binds and listens on `addr` (a Unix socket file must not exist).
    pub fn bind(addr: &ListenAddr) -> Result<Bound, String> {
        let (socket, bound, unix_path) = match addr {
            ListenAddr::Unix(p) => {
                if std::fs::symlink_metadata(p).is_ok() {
                    return Err(format!("{} already exists", p.display()));
                }
                let l = UnixListener::bind(p)
                    .map_err(|e| format!("cannot listen on {}: {e}", p.display()))?;
                (Socket::Unix(l), addr.clone(), Some(p.clone()))
            }
            ListenAddr::Tcp { host, port } => {
                let l = TcpListener::bind((host.as_str(), *port))
                    .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
                let local = l.local_addr().map_err(|e| e.to_string())?;
                let bound = ListenAddr::Tcp {
                    host: local.ip().to_string(),
                    port: local.port(),
                };
                (Socket::Tcp(l), bound, None)
            }
        };
        Ok(Bound {
            socket: Some(socket),
            bound,
            unix_path,
        })
    }

    /// Where clients connect (the bound port for `tcp:...:0`).
    pub fn bound(&self) -> &ListenAddr {
        &self.bound
    }

    /// Stops accepting, ends every connection and joins its thread, then
    /// removes the socket file. Once; later calls do nothing.
    pub fn stop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = self.unix_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Client {
    thread: JoinHandle<()>,
    /// A second handle on the socket, to shut its read side down at stop.
    socket: Stream,
}

struct Acceptor {
    socket: Socket,
    shared: Arc<ExportShared>,
    stop: Arc<EventFd>,
    /// Written by a connection thread as it ends.
    left: Arc<EventFd>,
    max: usize,
    clients: Vec<Client>,
}

impl Acceptor {
    fn run(mut self) {
        loop {
            self.clients.retain(|c| !c.thread.is_finished());
            let full = self.max != 0 && self.clients.len() >= self.max;
            let mut fds = [
                pollfd(self.stop.as_raw_fd()),
                pollfd(self.left.as_raw_fd()),
                pollfd(if full {
                    -1
                } else {
                    self.socket.as_fd().as_raw_fd()
                }),
            ];
            // SAFETY: `fds` is an array of valid pollfds for the call.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if r < 0 {
                continue;
            }
            if fds[0].revents != 0 {
                break;
            }
            if fds[1].revents != 0 {
                let _ = self.left.read();
            }
            if fds[2].revents != 0 {
                self.accept_one();
            }
        }
        for c in &self.clients {
            if let Stream::Unix(s) = &c.socket {
                let _ = s.shutdown(std::net::Shutdown::Read);
            }
            if let Stream::Tcp(s) = &c.socket {
                let _ = s.shutdown(std::net::Shutdown::Read);
            }
        }
        for c in self.clients.drain(..) {
            let _ = c.thread.join();
        }
    }

    fn accept_one(&mut self) {
        let stream = match self.socket.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                log::warn!("nbd: accept failed: {e}");
                return;
            }
        };
        let socket = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("nbd: dropping a client: {e}");
                return;
            }
        };
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        let left = self.left.clone();
        let spawned = std::thread::Builder::new()
            .name("nbd-conn".into())
            .spawn(move || {
                crate::connection::serve(stream, &shared, &stop);
                let _ = left.write(1);
            });
        match spawned {
            Ok(thread) => self.clients.push(Client { thread, socket }),
            Err(e) => log::warn!("nbd: cannot start a connection thread: {e}"),
        }
    }
}
