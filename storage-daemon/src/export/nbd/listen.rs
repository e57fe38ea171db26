//! The export's socket and its accept thread.
//!
//! `addr=unix:PATH` (a new socket file, removed at stop) or
//! `addr=tcp:HOST:PORT` (`tcp:[V6]:PORT`; port 10809 when left out). The
//! accept thread waits on the listening socket and the stop eventfd, and
//! starts one thread per client ([`super::connection::serve`]); at the
//! connection limit it stops accepting, as QEMU does, so further clients
//! wait in the backlog until one leaves. At stop it shuts the read side
//! of every client socket down (handshakes end, transmission loops stop
//! reading and finish what they have in flight) and joins every thread.

use std::fmt;
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use nbd::stream::Stream;
use nbd::wire::consts::DEFAULT_PORT;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::poll::pollfd;
use super::shared::ExportShared;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

impl ListenAddr {
    pub fn parse(s: &str) -> Result<ListenAddr, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(p)));
        }
        let Some(hp) = s.strip_prefix("tcp:") else {
            return Err("expected unix:PATH or tcp:HOST:PORT".into());
        };
        let (host, port) = if let Some(rest) = hp.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or("an IPv6 host needs its closing ]")?;
            (h, after.strip_prefix(':'))
        } else {
            match hp.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                Some(_) => return Err("put an IPv6 host in brackets: tcp:[::1]:10809".into()),
                None => (hp, None),
            }
        };
        if host.is_empty() {
            return Err("tcp: needs a host".into());
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p.parse().map_err(|_| format!("bad port '{p}'"))?,
        };
        Ok(ListenAddr::Tcp {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp { host, port } if host.contains(':') => {
                write!(f, "tcp:[{host}]:{port}")
            }
            ListenAddr::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

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

pub struct Listener {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    shown: String,
    unix_path: Option<PathBuf>,
}

impl Listener {
    pub fn start(
        addr: &ListenAddr,
        shared: Arc<ExportShared>,
        max_connections: u32,
    ) -> Result<Listener, String> {
        let (socket, shown, unix_path) = match addr {
            ListenAddr::Unix(p) => {
                if std::fs::symlink_metadata(p).is_ok() {
                    return Err(format!("{} already exists", p.display()));
                }
                let l = UnixListener::bind(p)
                    .map_err(|e| format!("cannot listen on {}: {e}", p.display()))?;
                (Socket::Unix(l), addr.to_string(), Some(p.clone()))
            }
            ListenAddr::Tcp { host, port } => {
                let l = TcpListener::bind((host.as_str(), *port))
                    .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
                let local = l.local_addr().map_err(|e| e.to_string())?;
                (Socket::Tcp(l), format!("tcp:{local}"), None)
            }
        };
        let nonblocking = match &socket {
            Socket::Unix(l) => l.set_nonblocking(true),
            Socket::Tcp(l) => l.set_nonblocking(true),
        };
        nonblocking.map_err(|e| e.to_string())?;
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?);
        let accept = Acceptor {
            socket,
            shared,
            stop: stop.clone(),
            left: Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|e| e.to_string())?),
            max: max_connections as usize,
            clients: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept.run())
            .map_err(|e| e.to_string())?;
        Ok(Listener {
            stop,
            thread: Some(thread),
            shown,
            unix_path,
        })
    }

    /// The address clients connect to (the bound port for `tcp:...:0`).
    pub fn addr(&self) -> &str {
        &self.shown
    }

    /// Stops accepting, ends every connection and joins its thread.
    pub fn stop(mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(p) = self.unix_path.take() {
            let _ = std::fs::remove_file(p);
        }
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
                super::connection::serve(stream, &shared, &stop);
                let _ = left.write(1);
            });
        match spawned {
            Ok(thread) => self.clients.push(Client { thread, socket }),
            Err(e) => log::warn!("nbd: cannot start a connection thread: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print() {
        assert_eq!(
            ListenAddr::parse("unix:/run/a.sock").unwrap(),
            ListenAddr::Unix("/run/a.sock".into())
        );
        for (s, host, port) in [
            ("tcp:localhost:99", "localhost", 99),
            ("tcp:127.0.0.1", "127.0.0.1", 10809),
            ("tcp:[::1]:7", "::1", 7),
        ] {
            let a = ListenAddr::parse(s).unwrap();
            assert_eq!(
                a,
                ListenAddr::Tcp {
                    host: host.into(),
                    port
                }
            );
        }
        assert_eq!(
            ListenAddr::parse("tcp:[::1]:7").unwrap().to_string(),
            "tcp:[::1]:7"
        );
        for bad in [
            "unix:",
            "tcp:",
            "tcp:h:x",
            "tcp:::1:7",
            "udp:x",
            "tcp:h:70000",
        ] {
            assert!(ListenAddr::parse(bad).is_err(), "{bad}");
        }
    }
}
