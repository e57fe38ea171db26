//! Shared by the NBD export tests: the daemon with an NBD export,
//! outside tools run under a deadline, scratch folders, and a raw client
//! that speaks the handshake and then sends whatever a test wants.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nbd::client::{negotiate, ClientConfig, ExportInfo};

/// Every outside command gets this long.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// The tools are all there (else a skip, or a failure under
/// `CH_REQUIRE_ALL=1`).
pub fn have(tools: &[&str]) -> bool {
    tools.iter().all(|t| testkit::has_command(t))
}

/// A scratch folder for one test, removed when the test ends.
pub fn scratch(name: &str) -> testkit::TempDir {
    testkit::TempDir::new(&format!("ch-nbd-{name}"))
}

/// Runs `cmd` to completion within [`DEADLINE`]; returns (success,
/// stdout+stderr).
pub fn try_run(cmd: &mut Command) -> (bool, String) {
    let dir = std::env::temp_dir();
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tag = format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let out_path = dir.join(format!("ch-nbd-out-{tag}"));
    let out = File::create(&out_path).unwrap();
    let mut child = cmd
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} ran past {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(out_path);
    (status.success(), text)
}

/// [`try_run`] that must succeed.
pub fn run(cmd: &mut Command) -> String {
    let (ok, text) = try_run(cmd);
    assert!(ok, "{cmd:?} failed:\n{text}");
    text
}

pub fn sh(script: &str) -> String {
    run(Command::new("sh").args(["-ec", script]))
}

/// The URI of the export `name` on the Unix socket `sock`.
pub fn unix_uri(sock: &Path, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", sock.display())
}

/// A TCP port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `ch-storage-daemon` (killed if a test fails before
/// [`Daemon::stop`]).
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts the daemon with `--image IMAGE --export type=nbd,EXPORT`
    /// and waits until it says it exports.
    pub fn start(dir: &Path, image: &str, export: &str) -> Daemon {
        Self::try_start(dir, image, export).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn try_start(dir: &Path, image: &str, export: &str) -> Result<Daemon, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("daemon-{n}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_ch-storage-daemon"))
            .args([
                "--image",
                image,
                "--export",
                &format!("type=nbd,{export}"),
                "-v",
            ])
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = d.child.try_wait().unwrap() {
                return Err(format!("daemon exited {status}: {}", d.log_text()));
            }
            if d.log_text().contains("exporting") {
                return Ok(d);
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not start: {}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then a clean exit within 30 s; returns the log.
    pub fn stop(mut self) -> String {
        let limit = Duration::from_secs(30);
        testkit::stop_cleanly(&mut self.child, "ch-storage-daemon", limit, &self.log);
        self.log_text()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A client that negotiates with our own handshake code, then lets a
/// test write any bytes it likes.
pub struct RawClient {
    pub s: UnixStream,
    pub info: ExportInfo,
}

impl RawClient {
    pub fn connect(sock: &Path, export: &str, structured: bool) -> RawClient {
        let mut s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let cfg = ClientConfig {
            export: export.into(),
            structured,
            block_status: structured,
        };
        let info = negotiate(&mut s, &cfg).unwrap();
        RawClient { s, info }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    pub fn request(&mut self, kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
        let mut b = Vec::new();
        nbd::wire::RequestHeader::new(kind, flags, cookie, offset, len).encode(&mut b);
        self.send(&b);
    }

    /// Reads a simple reply header: (error, cookie).
    pub fn simple_reply(&mut self) -> (u32, u64) {
        let mut b = [0u8; 16];
        self.s.read_exact(&mut b).unwrap();
        let h = nbd::wire::SimpleReplyHeader::decode(&b);
        assert_eq!(h.magic, nbd::wire::consts::SIMPLE_REPLY_MAGIC);
        (h.error, h.cookie)
    }

    pub fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).unwrap();
        b
    }

    /// True when the server closed the connection (EOF within 20 s).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}
