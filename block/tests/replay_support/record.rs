//! The write log of a replay run: every write, punch-hole / zero-range and
//! fdatasync that reaches the image's own file (file 0), from both paths
//! that reach it, plus the guest requests that caused them.
//!
//! - [`RecordingMetaIo`] wraps the image's metadata-I/O seam: a write is
//!   logged (its bytes copied) when it is issued and again when it
//!   returns; a sync is a barrier, logged at issue and completion.
//! - [`RecordingEngine`] wraps a queue's real engine: a `Writev` is logged
//!   with its bytes copied at push time, punch-hole and zero-range as
//!   zero writes, `Fdatasync` as a barrier; each op's completion is
//!   logged when it is reaped.
//! - The workload logs each guest request at submission and completion.
//!
//! Events enter through these wrappers into one [`Log`] (a shared,
//! ordered `Vec<Event>`); the crash-image builder reads it afterwards.
//! An event's position in the log is its time: everything logged before
//! it happened before it, as far as the block layer could know.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use block::engines::{Engine, EngineCompletion, HostOp, OpToken};
use block::error::BlockError;
use block::formats::qcow2::metadata::meta_io::{MetaIo, MetaKind};
use block::formats::FileId;
use vmm_sys_util::eventfd::EventFd;

/// Where a host write came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostSource {
    Meta(MetaKind),
    /// A `Writev` of a queue's engine.
    Engine,
    /// fallocate(PUNCH_HOLE | KEEP_SIZE): zeroes, the size stays.
    PunchHole,
    /// fallocate(ZERO_RANGE): zeroes, may extend the file.
    ZeroRange,
}

/// What a guest request asked for (the data a write carries).
#[derive(Clone, Debug)]
pub enum GuestOp {
    Write {
        offset: u64,
        data: Arc<Vec<u8>>,
    },
    /// Discard or write-zeroes: the range reads as zeroes once done.
    Zero {
        offset: u64,
        len: u64,
    },
    Flush,
}

#[derive(Clone, Debug)]
pub enum Event {
    /// A write to file 0 handed to the kernel (or about to be).
    /// `data` is `None` for zeroes (punch-hole, zero-range).
    WriteIssue {
        source: HostSource,
        offset: u64,
        len: u64,
        data: Option<Arc<Vec<u8>>>,
    },
    /// The write logged at `issue` returned: `done` bytes (from its start)
    /// reached the file, or it failed.
    WriteDone { issue: usize, done: Option<u64> },
    /// An fdatasync of file 0 issued (a barrier): by a queue's engine
    /// (a guest FLUSH) or at the metadata seam.
    SyncIssue { engine: bool },
    /// The fdatasync logged at `issue` returned (`ok`: it succeeded).
    SyncDone { issue: usize, ok: bool },
    /// A guest request submitted to a queue.
    GuestSubmit { op: GuestOp },
    /// The guest request logged at `submit` completed.
    GuestDone { submit: usize, ok: bool },
}

/// One line about `e` (REPLAY_KEEP dumps): offsets, lengths, sources and
/// the first bytes written.
pub fn describe(e: &Event) -> String {
    match e {
        Event::WriteIssue {
            source,
            offset,
            len,
            data,
        } => {
            let head: Vec<String> = data
                .iter()
                .flat_map(|d| d.iter().take(16))
                .map(|b| format!("{b:02x}"))
                .collect();
            format!(
                "write {source:?} at {offset:#x} len {len:#x} [{}]",
                head.join("")
            )
        }
        Event::WriteDone { issue, done } => format!("write-done of {issue}: {done:?}"),
        Event::SyncIssue { engine } => format!("sync (engine: {engine})"),
        Event::SyncDone { issue, ok } => format!("sync-done of {issue}: ok {ok}"),
        Event::GuestSubmit { op } => match op {
            GuestOp::Write { offset, data } => {
                format!("guest write at {offset:#x} len {:#x}", data.len())
            }
            GuestOp::Zero { offset, len } => format!("guest zero at {offset:#x} len {len:#x}"),
            GuestOp::Flush => "guest flush".into(),
        },
        Event::GuestDone { submit, ok } => format!("guest done of {submit}: ok {ok}"),
    }
}

/// The shared, ordered log.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Event>>>);

impl Log {
    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `e`; returns its index.
    pub fn push(&self, e: Event) -> usize {
        let mut g = self.lock();
        g.push(e);
        g.len() - 1
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }
}

/// Logs every metadata write and sync of an image (see the module docs).
pub struct RecordingMetaIo {
    inner: Arc<dyn MetaIo>,
    log: Log,
}

impl RecordingMetaIo {
    pub fn new(inner: Arc<dyn MetaIo>, log: Log) -> Self {
        RecordingMetaIo { inner, log }
    }
}

impl MetaIo for RecordingMetaIo {
    fn read_at(&self, kind: MetaKind, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(kind, buf, offset)
    }

    fn write_at(&self, kind: MetaKind, buf: &[u8], offset: u64) -> io::Result<usize> {
        let issue = self.log.push(Event::WriteIssue {
            source: HostSource::Meta(kind),
            offset,
            len: buf.len() as u64,
            data: Some(Arc::new(buf.to_vec())),
        });
        let r = self.inner.write_at(kind, buf, offset);
        let done = r.as_ref().ok().map(|&n| n as u64);
        self.log.push(Event::WriteDone { issue, done });
        r
    }

    fn sync(&self) -> io::Result<()> {
        let issue = self.log.push(Event::SyncIssue { engine: false });
        let r = self.inner.sync();
        self.log.push(Event::SyncDone {
            issue,
            ok: r.is_ok(),
        });
        r
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

/// What a pushed op of file 0 is waiting to log when it is reaped.
enum Pending {
    Write(usize),
    Sync(usize),
}

/// Logs every op a queue's engine runs on file 0 (see the module docs).
pub struct RecordingEngine {
    inner: Box<dyn Engine>,
    log: Log,
    pending: HashMap<OpToken, Pending>,
}

impl RecordingEngine {
    pub fn new(inner: Box<dyn Engine>, log: Log) -> Self {
        RecordingEngine {
            inner,
            log,
            pending: HashMap::new(),
        }
    }

    fn write_issue(
        &self,
        source: HostSource,
        offset: u64,
        len: u64,
        data: Option<Vec<u8>>,
    ) -> usize {
        self.log.push(Event::WriteIssue {
            source,
            offset,
            len,
            data: data.map(Arc::new),
        })
    }

    /// Logs the completions of recorded ops among `out`.
    fn note_reaped(&mut self, out: &[EngineCompletion]) {
        for c in out {
            match self.pending.remove(&c.token) {
                Some(Pending::Write(issue)) => {
                    let done = c.result.as_ref().ok().copied();
                    self.log.push(Event::WriteDone { issue, done });
                }
                Some(Pending::Sync(issue)) => {
                    self.log.push(Event::SyncDone {
                        issue,
                        ok: c.result.is_ok(),
                    });
                }
                None => {}
            }
        }
    }
}

/// The bytes a scatter list points at.
///
/// # Safety
///
/// `ptr` must point at `count` valid iovecs whose memory is readable.
unsafe fn gather(ptr: *const libc::iovec, count: u32) -> Vec<u8> {
    // SAFETY: per this function's contract.
    let list = unsafe { std::slice::from_raw_parts(ptr, count as usize) };
    let mut out = Vec::with_capacity(list.iter().map(|v| v.iov_len).sum());
    for v in list {
        // SAFETY: each iovec names readable memory (the contract).
        let bytes = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
        out.extend_from_slice(bytes);
    }
    out
}

// SAFETY: the recorder only reads the iovecs inside `push`, on the thread
// that owns the engine, while `Engine::push`'s contract keeps them valid.
unsafe impl Send for RecordingEngine {}

impl Engine for RecordingEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        let main = FileId(0);
        let pending = match &op {
            HostOp::Writev { file, offset, iov } if *file == main => {
                // SAFETY: `push`'s contract: the iovecs and their memory are
                // valid until this op is reaped, so now in particular.
                let data = unsafe { gather(iov.ptr, iov.count) };
                let len = data.len() as u64;
                Some(Pending::Write(self.write_issue(
                    HostSource::Engine,
                    *offset,
                    len,
                    Some(data),
                )))
            }
            HostOp::PunchHole { file, offset, len } if *file == main => Some(Pending::Write(
                self.write_issue(HostSource::PunchHole, *offset, *len, None),
            )),
            HostOp::ZeroRange { file, offset, len } if *file == main => Some(Pending::Write(
                self.write_issue(HostSource::ZeroRange, *offset, *len, None),
            )),
            HostOp::Fdatasync { file } if *file == main => Some(Pending::Sync(
                self.log.push(Event::SyncIssue { engine: true }),
            )),
            HostOp::Readv { .. } => None,
            other => panic!("an op changes a file other than the image's own: {other:?}"),
        };
        if let Some(p) = pending {
            self.pending.insert(token, p);
        }
        // SAFETY: forwarded contract.
        let r = unsafe { self.inner.push(token, op) };
        if r.is_err() {
            // Never queued: it will not be reaped.
            let c = EngineCompletion {
                token,
                result: Err(io::Error::other("push failed")),
            };
            self.note_reaped(&[c]);
        }
        r
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        self.inner.submit()
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        let start = out.len();
        self.inner.reap(out);
        self.note_reaped(&out[start..]);
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        let start = out.len();
        let r = self.inner.wait(out);
        self.note_reaped(&out[start..]);
        r
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        self.inner.eventfd()
    }
}
