//! An NBD server inside the test process, for what real servers will not
//! do: count connections, and break the protocol on purpose. It uses the
//! `nbd` crate's server handshake and request parser, and answers from
//! memory.

#![allow(dead_code)]

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nbd::server::{
    negotiate, replies, Command, ExportDesc, Negotiated, Parsed, RequestParser, Rules,
};
use nbd::wire::consts::{chunk, flag};
use nbd::wire::ChunkHeader;

/// How the server answers READs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehave {
    None,
    /// Answers with a cookie nobody sent.
    WrongCookie,
    /// Answers with a wrong magic.
    BadMagic,
    /// Sends half the data of a READ, then closes the connection.
    HangUpMidReply,
    /// Says DONE after covering only half of a READ.
    ShortRead,
    /// A data chunk outside the requested range.
    OutOfRange,
}

pub struct FakeServer {
    pub socket: PathBuf,
    pub connections: Arc<AtomicUsize>,
    pub data: Arc<Mutex<Vec<u8>>>,
}

impl FakeServer {
    /// Serves `size` bytes (byte i reads as `i / 512` mod 256) on a new
    /// socket in `dir`.
    pub fn start(dir: &Path, size: usize, multi_conn: bool, misbehave: Misbehave) -> FakeServer {
        let socket = dir.join("fake.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let data = Arc::new(Mutex::new(
            (0..size).map(|i| (i / 512) as u8).collect::<Vec<u8>>(),
        ));
        let (c, d) = (connections.clone(), data.clone());
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                c.fetch_add(1, Ordering::SeqCst);
                let d = d.clone();
                std::thread::spawn(move || serve(s, &d, multi_conn, misbehave));
            }
        });
        FakeServer {
            socket,
            connections,
            data,
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }
}

fn serve(mut s: UnixStream, data: &Mutex<Vec<u8>>, multi_conn: bool, misbehave: Misbehave) {
    let size = data.lock().unwrap().len() as u64;
    let mut flags = flag::HAS_FLAGS | flag::SEND_FLUSH | flag::SEND_TRIM | flag::SEND_WRITE_ZEROES;
    if multi_conn {
        flags |= flag::CAN_MULTI_CONN;
    }
    let desc = ExportDesc {
        name: String::new(),
        description: None,
        size,
        flags,
        block_sizes: [1, 4096, 1 << 20],
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let Ok(Negotiated::Go(session)) = negotiate(&mut s, &desc) else {
        return;
    };
    let mut parser = RequestParser::new(Rules {
        size,
        writable: true,
        structured: session.structured,
        block_status: session.base_allocation,
        max_payload: 1 << 20,
    });
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match std::io::Read::read(&mut s, &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut parsed = Vec::new();
        if parser.feed(&buf[..n], &mut parsed).is_err() {
            return;
        }
        for p in parsed {
            let mut out = Vec::new();
            match p {
                Parsed::Request(r) => {
                    let (off, len) = (r.offset as usize, r.len as usize);
                    match r.command {
                        Command::Read => {
                            let d = data.lock().unwrap()[off..off + len].to_vec();
                            let cookie = match misbehave {
                                Misbehave::WrongCookie => r.cookie ^ 0xdead,
                                _ => r.cookie,
                            };
                            match misbehave {
                                Misbehave::BadMagic => out.extend_from_slice(&[0xab; 20]),
                                Misbehave::HangUpMidReply => {
                                    replies::data_chunk(
                                        &mut out, cookie, r.offset, len as u32, true,
                                    );
                                    out.extend_from_slice(&d[..len / 2]);
                                    let _ = s.write_all(&out);
                                    return;
                                }
                                Misbehave::ShortRead => {
                                    replies::data_chunk(
                                        &mut out,
                                        cookie,
                                        r.offset,
                                        (len / 2) as u32,
                                        true,
                                    );
                                    out.extend_from_slice(&d[..len / 2]);
                                }
                                Misbehave::OutOfRange => {
                                    replies::data_chunk(
                                        &mut out,
                                        cookie,
                                        r.offset + 1,
                                        len as u32,
                                        true,
                                    );
                                    out.extend_from_slice(&d);
                                }
                                _ => {
                                    replies::data_chunk(
                                        &mut out, cookie, r.offset, len as u32, true,
                                    );
                                    out.extend_from_slice(&d);
                                }
                            }
                        }
                        Command::Write(w) => {
                            data.lock().unwrap()[off..off + len].copy_from_slice(&w);
                            replies::ok(&mut out, r.cookie);
                        }
                        Command::WriteZeroes | Command::Trim => {
                            data.lock().unwrap()[off..off + len].fill(0);
                            replies::ok(&mut out, r.cookie);
                        }
                        Command::BlockStatus => {
                            replies::block_status_chunk(&mut out, r.cookie, 0, &[(r.len, 0)]);
                        }
                        _ => replies::ok(&mut out, r.cookie),
                    }
                }
                Parsed::Reject { cookie, error, .. } => {
                    let mut h = Vec::new();
                    ChunkHeader::new(chunk::FLAG_DONE, chunk::ERROR, cookie, 6).encode(&mut h);
                    out.extend_from_slice(&h);
                    out.extend_from_slice(&error.to_be_bytes());
                    out.extend_from_slice(&[0, 0]);
                }
                Parsed::Disconnect => return,
            }
            if s.write_all(&out).is_err() {
                return;
            }
        }
    }
}

/// A scratch folder for one test, removed when the test ends.
pub fn scratch(name: &str) -> testkit::TempDir {
    testkit::TempDir::new(&format!("ch-nbdc-{name}"))
}

/// Runs `f` on a thread and fails the test if it takes longer than
/// `secs` (so no test can hang on a client bug).
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("did not finish within {secs} s"))
}

/// Log records of this test process, kept for tests that assert what
/// the client logs (every record at info and above; tests filter by
/// their own socket path, as tests run in parallel).
pub mod captured_log {
    use std::sync::{Mutex, Once};

    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
    static INSTALL: Once = Once::new();

    struct Capture;

    static CAPTURE: Capture = Capture;

    impl log::Log for Capture {
        fn enabled(&self, m: &log::Metadata) -> bool {
            m.level() <= log::Level::Info
        }
        fn log(&self, r: &log::Record) {
            if self.enabled(r.metadata()) {
                let line = format!("{}: {}", r.level(), r.args());
                LINES.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        }
        fn flush(&self) {}
    }

    /// Starts capturing (once per process).
    pub fn install() {
        INSTALL.call_once(|| {
            log::set_logger(&CAPTURE).expect("no other logger in this test");
            log::set_max_level(log::LevelFilter::Info);
        });
    }

    /// The captured lines that contain `needle`.
    pub fn lines_with(needle: &str) -> Vec<String> {
        LINES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}
