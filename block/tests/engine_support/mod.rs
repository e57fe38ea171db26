//! Shared helpers for the engine and conformance tests: temp dirs, image
//! creation with qemu-img, a blocking driver over a `DiskQueue`, guest
//! memory requests, and a deterministic PRNG.
#![allow(dead_code)]

pub mod conformance;
pub mod faults;
pub mod hold;
pub mod scripted;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use block::request::GuestSegment;
use block::{BlockRequest, Completion, DiskQueue, IoMemory, RequestOp};
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// A self-cleaning temporary directory.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        // Cargo's per-target scratch dir (on the build disk, where O_DIRECT
        // behaves like on a real image store); else the system temp dir.
        let base = option_env!("CARGO_TARGET_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let p = base.join(format!(
            "{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a command, panicking with its output on failure.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn qemu_img(args: &[&str]) -> String {
    run(Command::new("qemu-img").args(args))
}

pub fn qemu_io(fmt: &str, path: &Path, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.arg("-f").arg(fmt);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    c.arg(path);
    run(&mut c)
}

/// xorshift64*: deterministic, dependency-free.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Submits `reqs` and blocks until each has completed; returns the
/// completions in user_data order.
pub fn run_batch(q: &mut DiskQueue, reqs: Vec<BlockRequest>) -> Vec<Completion> {
    let n = reqs.len();
    q.submit_batch_requests(reqs);
    let mut out = Vec::new();
    while out.len() < n {
        q.wait_completions(&mut out).unwrap();
        assert!(out.len() <= n, "more completions than requests");
    }
    assert_eq!(q.in_flight(), 0);
    out.sort_by_key(|c| c.user_data);
    out
}

/// Like [`run_batch`], but drives the queue the way a device worker does:
/// sleep in poll(2) on the completion eventfd, then drain. A queue that
/// leaves work unsubmitted when it returns (say, a resubmitted short read)
/// never wakes, and this panics after 10 s instead of hanging.
pub fn run_batch_polling(q: &mut DiskQueue, reqs: Vec<BlockRequest>) -> Vec<Completion> {
    use std::os::fd::AsRawFd;
    let n = reqs.len();
    q.submit_batch_requests(reqs);
    let mut out = Vec::new();
    while out.len() < n {
        let mut pfd = libc::pollfd {
            fd: q.completion_eventfd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert!(
            r != 0,
            "queue stalled: {} of {n} completions after 10 s",
            out.len()
        );
        q.drain_completions(&mut out);
        assert!(out.len() <= n, "more completions than requests");
    }
    assert_eq!(q.in_flight(), 0);
    out.sort_by_key(|c| c.user_data);
    out
}

pub fn read_req(user_data: u64, offset: u64, len: usize) -> BlockRequest {
    BlockRequest {
        user_data,
        op: RequestOp::Read,
        offset,
        memory: IoMemory::Owned(vec![0xee; len]),
    }
}

pub fn write_req(user_data: u64, offset: u64, data: Vec<u8>) -> BlockRequest {
    BlockRequest {
        user_data,
        op: RequestOp::Write,
        offset,
        memory: IoMemory::Owned(data),
    }
}

pub fn op_req(user_data: u64, op: RequestOp, offset: u64) -> BlockRequest {
    BlockRequest {
        user_data,
        op,
        offset,
        memory: IoMemory::None,
    }
}

/// Guest memory for requests that scatter over several segments.
pub fn guest_memory(size: usize) -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).unwrap())
}

/// `len` bytes spread over segments of `seg` bytes placed `gap` apart
/// starting at guest address `base` (the gap makes them non-contiguous).
pub fn scattered(base: u64, len: u32, seg: u32, gap: u64) -> Vec<GuestSegment> {
    let mut v = Vec::new();
    let mut left = len;
    let mut addr = base;
    while left > 0 {
        let n = left.min(seg);
        v.push(GuestSegment {
            addr: GuestAddress(addr),
            len: n,
        });
        addr += u64::from(n) + gap;
        left -= n;
    }
    v
}

/// Copies guest segments out (or in) for checks.
pub fn guest_read(mem: &GuestMemoryMmap, segs: &[GuestSegment]) -> Vec<u8> {
    use vm_memory::Bytes;
    let mut out = Vec::new();
    for s in segs {
        let mut b = vec![0u8; s.len as usize];
        mem.read_slice(&mut b, s.addr).unwrap();
        out.extend_from_slice(&b);
    }
    out
}

pub fn guest_write(mem: &GuestMemoryMmap, segs: &[GuestSegment], data: &[u8]) {
    use vm_memory::Bytes;
    let mut pos = 0;
    for s in segs {
        mem.write_slice(&data[pos..pos + s.len as usize], s.addr)
            .unwrap();
        pos += s.len as usize;
    }
}
