//! The API server's threads: one accepts, and each connection gets a
//! short-lived thread of its own (at most [`MAX_CONNECTIONS`] at once;
//! beyond that a client gets 503 at once). A connection thread reads one
//! request ([`super::http`]), passes it to the control loop and writes
//! the answer, so a slow or silent client holds only its own thread, and
//! only until the request deadline.
//!
//! The threads run under the API's own seccomp filter, installed on the
//! accepting thread before it accepts anything (connection threads
//! inherit it).

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::channel::ApiSender;
use super::endpoint::Endpoint;
use super::http::{read_request, write_response};
use super::response::ApiResponse;
use super::routes;

/// The endpoint table the connection threads route by.
pub type Table<C> = Arc<Vec<Endpoint<C>>>;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 8;
/// How long a connection thread waits for the control loop's answer
/// (a removal waits for the guest, up to its own limit, and drains).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The running server; [`ApiServer::stop`] ends it.
pub struct ApiServer {
    acceptor: Option<JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
    listener: Arc<UnixListener>,
    /// The socket file to remove at the end (`path=` only).
    path: Option<PathBuf>,
}

impl ApiServer {
    /// Starts serving `listener`; requests are routed by `table` and go
    /// to `sender`. The accepting thread installs `filters` first.
    pub(crate) fn start<C: 'static>(
        listener: UnixListener,
        table: Table<C>,
        sender: ApiSender<C>,
        filters: Vec<seccompiler::BpfProgram>,
        path: Option<PathBuf>,
    ) -> std::io::Result<ApiServer> {
        let stopping = Arc::new(AtomicBool::new(false));
        let listener = Arc::new(listener);
        let (stop, accepting) = (stopping.clone(), listener.clone());
        let acceptor = std::thread::Builder::new()
            .name("api".into())
            .spawn(move || {
                if let Err(e) = crate::seccomp::apply_programs(&filters) {
                    log::error!("api: cannot install the seccomp filter, not serving: {e}");
                    return;
                }
                accept_loop(&accepting, &table, sender, stop)
            })?;
        Ok(ApiServer {
            acceptor: Some(acceptor),
            stopping,
            listener,
            path,
        })
    }

    /// Stops accepting, waits for the connections in progress (each ends
    /// within its deadlines) and removes the socket file.
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::Release);
        // SAFETY: shutdown on a listener this server holds open (the
        // Arc); it only makes the accepting thread's accept return.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.acceptor.take() {
            if t.join().is_err() {
                log::error!("api: the server thread panicked");
            }
        }
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn accept_loop<C: 'static>(
    listener: &UnixListener,
    table: &Table<C>,
    sender: ApiSender<C>,
    stopping: Arc<AtomicBool>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let conn = listener.accept();
        if stopping.load(Ordering::Acquire) {
            break;
        }
        threads.retain(|t| !t.is_finished());
        let mut stream = match conn {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!("api: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let r = ApiResponse::error(
                503,
                &[&format!(
                    "too many API connections (at most {MAX_CONNECTIONS} at once)"
                )],
            );
            let _ = write_response(&mut stream, r.status, r.body.as_deref());
            refuse_gently(stream);
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (sender, count, table) = (sender.clone(), active.clone(), table.clone());
        let spawned = std::thread::Builder::new()
            .name("api-conn".into())
            .spawn(move || {
                serve(stream, &table, &sender);
                count.fetch_sub(1, Ordering::AcqRel);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                active.fetch_sub(1, Ordering::AcqRel);
                log::error!("api: cannot start a connection thread: {e}");
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
}

/// Closes a connection whose answer is written without resetting it
/// (the client's unread request would make close send RST, and the
/// client could lose the answer): stop writing, read what has arrived
/// for a moment, then close.
fn refuse_gently(mut stream: UnixStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut sink = [0u8; 4096];
    for _ in 0..4 {
        match std::io::Read::read(&mut stream, &mut sink) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
}

/// One request, one answer.
fn serve<C: 'static>(mut stream: UnixStream, table: &[Endpoint<C>], sender: &ApiSender<C>) {
    let response = match read_request(&mut stream) {
        Ok(req) => {
            log::info!("api: {} {}", req.method, req.path);
            match routes::route(table, &req.method, &req.path, &req.body) {
                Ok(r) => sender.call(r.name, r.job, ANSWER_TIMEOUT),
                Err(refused) => refused,
            }
        }
        Err(e) => {
            log::info!("api: {}", e.message);
            match e.status {
                Some(status) => ApiResponse::error(status, &[&e.message]),
                None => return,
            }
        }
    };
    if response.status >= 400 {
        log::info!(
            "api: answered {}: {}",
            response.status,
            response.body.as_deref().unwrap_or("")
        );
    }
    if let Err(e) = write_response(&mut stream, response.status, response.body.as_deref()) {
        log::info!("api: cannot write the answer: {e}");
    }
}
