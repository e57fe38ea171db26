//! A fault-injecting engine wrapper: shortens transfers, answers EAGAIN or
//! EIO instead of running chosen ops, and counts every push and reap so
//! tests can prove no op is orphaned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use block::engines::{new_engine, Engine, EngineCompletion, HostOp, OpToken, RawIovecs};
use block::error::BlockError;
use block::{Disk, DiskOptions, DiskQueue, EngineKind};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::scripted::ScriptedFormat;

/// What to do to the Nth push (1-based, counting every push including
/// resubmissions).
#[derive(Clone, Default)]
pub struct FaultPlan {
    /// Halve every read/write of more than one byte.
    pub short: bool,
    /// Shortened lengths are multiples of this (O_DIRECT files need it).
    pub short_align: usize,
    /// Answer EAGAIN instead of running every Nth push.
    pub eagain_every: Option<u64>,
    /// Answer an error instead of running these pushes.
    pub fail_pushes: Vec<u64>,
    /// The errno of `fail_pushes` (EIO when 0).
    pub fail_errno: i32,
}

#[derive(Debug, Default, Clone)]
pub struct FaultStats {
    pub pushes: u64,
    pub reads: u64,
    pub shortened: u64,
    pub eagains: u64,
    pub failed: u64,
    pub reaped: u64,
    /// Tokens pushed and not yet reaped.
    pub outstanding: usize,
}

pub struct FaultEngine {
    inner: Box<dyn Engine>,
    plan: FaultPlan,
    stats: Arc<Mutex<FaultStats>>,
    /// Shortened iovec arrays, alive until their op is reaped.
    kept: HashMap<OpToken, Vec<libc::iovec>>,
    synthetic: Vec<EngineCompletion>,
    outstanding: HashMap<OpToken, ()>,
}

// SAFETY: the kept iovecs point into memory the executor keeps alive per
// `Engine::push`'s contract; they are used only by the owning thread.
unsafe impl Send for FaultEngine {}

impl FaultEngine {
    pub fn new(inner: Box<dyn Engine>, plan: FaultPlan) -> (Self, Arc<Mutex<FaultStats>>) {
        let stats = Arc::new(Mutex::new(FaultStats::default()));
        (
            FaultEngine {
                inner,
                plan,
                stats: stats.clone(),
                kept: HashMap::new(),
                synthetic: Vec::new(),
                outstanding: HashMap::new(),
            },
            stats,
        )
    }

    fn note_reaped(&mut self, out: &[EngineCompletion]) {
        let mut s = self.stats.lock().unwrap();
        for c in out {
            assert!(
                self.outstanding.remove(&c.token).is_some(),
                "token {:#x} reaped twice or never pushed",
                c.token
            );
            self.kept.remove(&c.token);
            s.reaped += 1;
        }
        s.outstanding = self.outstanding.len();
    }

    /// Halves a scatter list: a new iovec array of the first half.
    fn shorten(&mut self, token: OpToken, iov: &RawIovecs) -> Option<RawIovecs> {
        // SAFETY: per `push`'s contract the array has `count` valid iovecs.
        let list = unsafe { std::slice::from_raw_parts(iov.ptr, iov.count as usize) };
        let total: usize = list.iter().map(|v| v.iov_len).sum();
        if total < 2 {
            return None;
        }
        let align = self.plan.short_align.max(1);
        let mut want = total / 2 / align * align;
        if want == 0 {
            return None;
        }
        let mut short = Vec::new();
        for v in list {
            if want == 0 {
                break;
            }
            let n = v.iov_len.min(want);
            short.push(libc::iovec {
                iov_base: v.iov_base,
                iov_len: n,
            });
            want -= n;
        }
        let raw = RawIovecs {
            ptr: short.as_ptr(),
            count: short.len() as u32,
        };
        self.kept.insert(token, short);
        Some(raw)
    }
}

impl Engine for FaultEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        let n = {
            let mut s = self.stats.lock().unwrap();
            s.pushes += 1;
            if matches!(op, HostOp::Readv { .. }) {
                s.reads += 1;
            }
            s.pushes
        };
        assert!(
            self.outstanding.insert(token, ()).is_none(),
            "token {token:#x} pushed while in flight"
        );
        let fail = |errno: i32| EngineCompletion {
            token,
            result: Err(std::io::Error::from_raw_os_error(errno)),
        };
        if self.plan.fail_pushes.contains(&n) {
            self.stats.lock().unwrap().failed += 1;
            let errno = if self.plan.fail_errno == 0 {
                libc::EIO
            } else {
                self.plan.fail_errno
            };
            self.synthetic.push(fail(errno));
            let _ = self.inner.eventfd().write(1);
            return Ok(());
        }
        if self.plan.eagain_every.is_some_and(|k| n % k == 0) {
            self.stats.lock().unwrap().eagains += 1;
            self.synthetic.push(fail(libc::EAGAIN));
            let _ = self.inner.eventfd().write(1);
            return Ok(());
        }
        let op = match op {
            HostOp::Readv { file, offset, iov } if self.plan.short => {
                match self.shorten(token, &iov) {
                    Some(iov) => {
                        self.stats.lock().unwrap().shortened += 1;
                        HostOp::Readv { file, offset, iov }
                    }
                    None => HostOp::Readv { file, offset, iov },
                }
            }
            HostOp::Writev { file, offset, iov } if self.plan.short => {
                match self.shorten(token, &iov) {
                    Some(iov) => {
                        self.stats.lock().unwrap().shortened += 1;
                        HostOp::Writev { file, offset, iov }
                    }
                    None => HostOp::Writev { file, offset, iov },
                }
            }
            other => other,
        };
        // SAFETY: forwarded contract; a shortened array lives in `kept`
        // until the op is reaped.
        unsafe { self.inner.push(token, op) }
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        self.inner.submit()
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        let start = out.len();
        out.append(&mut self.synthetic);
        self.inner.reap(out);
        let new: Vec<_> = out.drain(start..).collect();
        self.note_reaped(&new);
        out.extend(new);
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        let start = out.len();
        if self.synthetic.is_empty() {
            self.inner.wait(out)?;
        }
        out.append(&mut self.synthetic);
        self.inner.reap(out);
        let new: Vec<_> = out.drain(start..).collect();
        self.note_reaped(&new);
        out.extend(new);
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.synthetic.len()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        self.inner.eventfd()
    }
}

/// A disk over `format` and a queue on `kind` wrapped in a fault engine
/// following `plan`; the stats count what the engine did.
pub fn faulty_queue(
    format: Arc<ScriptedFormat>,
    kind: EngineKind,
    plan: FaultPlan,
) -> (Disk, DiskQueue, Arc<Mutex<FaultStats>>) {
    let mut o = DiskOptions::new("scripted");
    o.engine = kind;
    let disk = Disk::from_format(format.clone(), &o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let inner = new_engine(kind, format.files.local(), efd).unwrap();
    let (engine, stats) = FaultEngine::new(inner, plan);
    let q = disk.queue_on(Box::new(engine));
    (disk, q, stats)
}
