//! The server's API as the VMM will use it: an export of a source that
//! is not a `block::Disk` (bytes in memory, with a bitmap of its own),
//! started on `unix:` and `tcp:` addresses, read and written by clients
//! nobody here wrote (qemu-io, nbdinfo), and stopped (or dropped) with
//! clients connected.

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use block::{BlockError, BlockRequest, Completion, IoMemory, RequestOp};
use nbd_server::{
    Allocation, DirtyBitmap, ExportConfig, ExportSource, ExportedBitmap, ListenAddr, NbdServer,
    SourceQueue,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const SIZE: usize = 1 << 20;
/// The memory source's bitmap: 64 KiB granules 1 and 3..=4 dirty.
const DIRTY: [u64; 3] = [1, 3, 4];
const GRANULE: u64 = 64 << 10;

/// Bytes in memory: reads and writes complete at submission; the first
/// half is "data", the second half a hole.
struct MemorySource {
    bytes: Arc<Mutex<Vec<u8>>>,
}

struct MemoryQueue {
    bytes: Arc<Mutex<Vec<u8>>>,
    done: Vec<Completion>,
    eventfd: EventFd,
}

impl SourceQueue for MemoryQueue {
    fn submit(&mut self, batch: &mut Vec<BlockRequest>) {
        let mut bytes = self.bytes.lock().unwrap();
        for r in batch.drain(..) {
            let at = r.offset as usize;
            let (op, offset, len) = (r.op, r.offset, r.len());
            let (result, memory) = match (r.op, r.memory) {
                (RequestOp::Read, IoMemory::Owned(mut b)) => {
                    let n = b.len();
                    b.copy_from_slice(&bytes[at..at + n]);
                    (Ok(b.len() as u64), IoMemory::Owned(b))
                }
                (RequestOp::Write, IoMemory::Owned(b)) => {
                    bytes[at..at + b.len()].copy_from_slice(&b);
                    (Ok(b.len() as u64), IoMemory::Owned(b))
                }
                (RequestOp::WriteZeroes { len, .. } | RequestOp::Discard { len }, m) => {
                    bytes[at..at + len as usize].fill(0);
                    (Ok(len), m)
                }
                (RequestOp::Flush, m) => (Ok(0), m),
                (_, m) => (Err(BlockError::Refused("memory not owned".into())), m),
            };
            self.done.push(Completion {
                user_data: r.user_data,
                op,
                offset,
                len,
                result,
                memory,
            });
        }
        self.eventfd.write(1).unwrap();
    }

    fn completion_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    fn drain_completions(&mut self, out: &mut Vec<Completion>) {
        let _ = self.eventfd.read();
        out.append(&mut self.done);
    }
}

struct Granules;

impl DirtyBitmap for Granules {
    fn granularity(&self) -> u64 {
        GRANULE
    }

    fn next_dirty(&self, from: u64, end: u64) -> Option<(u64, u64)> {
        let first = *DIRTY
            .iter()
            .find(|&&g| (g + 1) * GRANULE > from && g * GRANULE < end)?;
        let mut last = first;
        while DIRTY.contains(&(last + 1)) {
            last += 1;
        }
        let start = (first * GRANULE).max(from);
        Some((start, ((last + 1) * GRANULE).min(end) - start))
    }
}

impl ExportSource for MemorySource {
    fn size(&self) -> u64 {
        SIZE as u64
    }

    fn readonly(&self) -> bool {
        false
    }

    fn queue(&self) -> Result<Box<dyn SourceQueue>, BlockError> {
        Ok(Box::new(MemoryQueue {
            bytes: self.bytes.clone(),
            done: Vec::new(),
            eventfd: EventFd::new(EFD_NONBLOCK).unwrap(),
        }))
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<Allocation, BlockError> {
        let half = SIZE as u64 / 2;
        let (end, data) = if offset < half {
            (half, true)
        } else {
            (SIZE as u64, false)
        };
        Ok(Allocation {
            len: (end - offset).min(len),
            data,
            zero: !data,
        })
    }

    fn bitmaps(&self) -> Vec<ExportedBitmap> {
        vec![ExportedBitmap {
            name: "mine".into(),
            bitmap: Arc::new(Granules),
        }]
    }
}

fn have(tools: &[&str]) -> bool {
    tools.iter().all(|t| testkit::has_command(t))
}

fn run(cmd: &mut Command) -> String {
    let out = testkit::output_within(cmd, testkit::COMMAND_LIMIT);
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn memory_source() -> (Arc<dyn ExportSource>, Arc<Mutex<Vec<u8>>>) {
    let bytes = Arc::new(Mutex::new(vec![0u8; SIZE]));
    let source = MemorySource {
        bytes: bytes.clone(),
    };
    (Arc::new(source), bytes)
}

fn config(addr: ListenAddr, name: &str) -> ExportConfig {
    ExportConfig {
        addr,
        name: name.into(),
        description: None,
        writable: true,
        max_connections: 0,
    }
}

#[test]
fn a_source_that_is_not_a_disk_is_served_and_stopped() {
    if !have(&["qemu-io", "nbdinfo"]) {
        return;
    }
    let dir = testkit::TempDir::new("nbd-server-api");
    let sock = dir.path().join("mem.sock");
    let (source, bytes) = memory_source();
    let server = NbdServer::start(&config(ListenAddr::Unix(sock.clone()), "mem"), source).unwrap();
    let uri = server.uri();
    assert_eq!(uri, format!("nbd+unix:///mem?socket={}", sock.display()));
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 4096 8192",
        "-c",
        "read -P 0x5a 4096 8192",
        &uri,
    ]));
    assert!(bytes.lock().unwrap()[4096..12288]
        .iter()
        .all(|&b| b == 0x5a));
    let map = run(Command::new("nbdinfo").args(["--map=qemu:dirty-bitmap:mine", &uri]));
    assert_eq!(
        map,
        "         0       65536    0  clean\n     \
         65536       65536    1  dirty\n    \
         131072       65536    0  clean\n    \
         196608      131072    1  dirty\n    \
         327680      720896    0  clean\n"
    );
    let map = run(Command::new("nbdinfo").args(["--map", &uri]));
    assert_eq!(
        map,
        "         0      524288    0  data\n    524288      524288    3  hole,zero\n"
    );
    // A client still connected when the export stops is let go.
    let mut idle = UnixStream::connect(&sock).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = Instant::now();
    server.stop();
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(!sock.exists(), "the socket file is removed");
    let mut rest = Vec::new();
    let _ = idle.read_to_end(&mut rest);
    assert!(UnixStream::connect(&sock).is_err());
}

#[test]
fn tcp_port_zero_is_bound_and_named_in_the_uri() {
    if !have(&["nbdinfo"]) {
        return;
    }
    let (source, _) = memory_source();
    let addr = ListenAddr::parse("tcp:127.0.0.1:0").unwrap();
    let server = NbdServer::start(&config(addr, "a disk"), source).unwrap();
    let ListenAddr::Tcp { host, port } = server.addr().clone() else {
        panic!("not tcp")
    };
    assert_eq!(host, "127.0.0.1");
    assert_ne!(port, 0);
    assert_eq!(server.uri(), format!("nbd://127.0.0.1:{port}/a%20disk"));
    assert!(server.describe().contains(&format!("tcp:127.0.0.1:{port}")));
    let size = run(Command::new("nbdinfo").args(["--size", &server.uri()]));
    assert_eq!(size.trim(), SIZE.to_string());
    // Dropped, it stops: the port refuses connections. (Asked again for
    // a while: under load a connect to a just-closed loopback port can
    // be the rare one whose kernel-chosen source port is that same port,
    // a TCP self-connect that succeeds.)
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "port {port} still accepts after the drop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn start_refuses_what_cannot_work_and_leaves_no_socket() {
    let dir = testkit::TempDir::new("nbd-server-refusals");
    let sock = dir.path().join("s.sock");
    std::fs::write(&sock, b"").unwrap();
    let (source, _) = memory_source();
    let err = NbdServer::start(&config(ListenAddr::Unix(sock.clone()), ""), source.clone())
        .err()
        .unwrap();
    assert!(err.to_string().contains("already exists"), "{err}");
    std::fs::remove_file(&sock).unwrap();
    let long = config(ListenAddr::Unix(sock.clone()), &"n".repeat(4097));
    let err = NbdServer::start(&long, source).err().unwrap();
    assert!(err.to_string().contains("4096"), "{err}");
    assert!(!sock.exists());
}

#[test]
fn a_bound_export_serves_nothing_until_told_and_clients_wait_for_it() {
    if !have(&["nbdinfo"]) {
        return;
    }
    let dir = testkit::TempDir::new("nbd-server-bind");
    let sock = dir.path().join("b.sock");
    let cfg = config(ListenAddr::Unix(sock.clone()), "later");
    // Dropped unserved: the socket file goes.
    drop(NbdServer::bind(&cfg).unwrap());
    assert!(!sock.exists());
    let bound = NbdServer::bind(&cfg).unwrap();
    assert_eq!(bound.addr(), &ListenAddr::Unix(sock.clone()));
    let uri = format!("nbd+unix:///later?socket={}", sock.display());
    let mut early = testkit::ChildGuard(
        Command::new("nbdinfo")
            .args(["--size", &uri])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        early.try_wait().unwrap().is_none(),
        "a client got an answer before the export was served"
    );
    let (source, _) = memory_source();
    let server = bound.serve(source).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = early.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the early client still waits");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let mut out = String::new();
    early
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(out.trim(), SIZE.to_string());
    server.stop();
    assert!(!sock.exists());
}
