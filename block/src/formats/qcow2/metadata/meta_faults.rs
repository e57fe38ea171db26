//! A fault-injecting [`MetaIo`] for tests: wraps an image's metadata I/O
//! and fails the Nth write (of one kind, or of any) with an errno, shortens
//! it, or fails the Nth read, fdatasync or change of the file's length. Install it on an opened image with
//! `Qcow2Image::wrap_meta_io`.
//!
//! A list of [`MetaFault`]s enters; transfers pass through to the wrapped
//! implementation except the ones a fault picks. Each fault fires once.

use std::io;
use std::sync::{Arc, Mutex};

use super::meta_io::{MetaIo, MetaKind};

/// What a fault does to the transfer it picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultEffect {
    /// Fail with this errno (EIO, ENOSPC, ...); nothing is written.
    Errno(i32),
    /// Write only the first half (at least one byte) and report that.
    ShortWrite,
}

/// Which transfer a fault picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTarget {
    /// The Nth write (1-based) of this kind, or of any kind when `None`.
    Write { kind: Option<MetaKind>, nth: u64 },
    /// The Nth read (1-based) of this kind, or of any kind.
    Read { kind: Option<MetaKind>, nth: u64 },
    /// The Nth fdatasync (1-based).
    Sync { nth: u64 },
    /// The Nth change of the file's length (1-based).
    SetLen { nth: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaFault {
    pub target: FaultTarget,
    pub effect: FaultEffect,
}

impl MetaFault {
    /// The Nth write of `kind` fails with `errno`.
    pub fn fail_write(kind: Option<MetaKind>, nth: u64, errno: i32) -> Self {
        MetaFault {
            target: FaultTarget::Write { kind, nth },
            effect: FaultEffect::Errno(errno),
        }
    }

    /// The Nth fdatasync fails with `errno`.
    pub fn fail_sync(nth: u64, errno: i32) -> Self {
        MetaFault {
            target: FaultTarget::Sync { nth },
            effect: FaultEffect::Errno(errno),
        }
    }

    /// The Nth read of `kind` fails with `errno`.
    pub fn fail_read(kind: Option<MetaKind>, nth: u64, errno: i32) -> Self {
        MetaFault {
            target: FaultTarget::Read { kind, nth },
            effect: FaultEffect::Errno(errno),
        }
    }

    /// The Nth change of the file's length fails with `errno`.
    pub fn fail_set_len(nth: u64, errno: i32) -> Self {
        MetaFault {
            target: FaultTarget::SetLen { nth },
            effect: FaultEffect::Errno(errno),
        }
    }
}

/// Transfers seen so far, and how many faults fired.
#[derive(Clone, Debug, Default)]
pub struct MetaIoStats {
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub set_lens: u64,
    pub fired: u64,
}

struct Armed {
    fault: MetaFault,
    seen: u64,
    done: bool,
}

pub struct FaultyMetaIo {
    inner: Arc<dyn MetaIo>,
    armed: Mutex<(Vec<Armed>, MetaIoStats)>,
}

enum Op {
    Read(MetaKind),
    Write(MetaKind),
    Sync,
    SetLen,
}

impl FaultyMetaIo {
    pub fn new(inner: Arc<dyn MetaIo>, faults: &[MetaFault]) -> Self {
        let armed = faults
            .iter()
            .map(|f| Armed {
                fault: *f,
                seen: 0,
                done: false,
            })
            .collect();
        FaultyMetaIo {
            inner,
            armed: Mutex::new((armed, MetaIoStats::default())),
        }
    }

    pub fn stats(&self) -> MetaIoStats {
        self.armed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone()
    }

    /// Counts `op` and returns the effect of the fault it triggers.
    fn pick(&self, op: Op) -> Option<FaultEffect> {
        let mut g = self.armed.lock().unwrap_or_else(|p| p.into_inner());
        let (armed, stats) = &mut *g;
        match op {
            Op::Read(_) => stats.reads += 1,
            Op::Write(_) => stats.writes += 1,
            Op::Sync => stats.syncs += 1,
            Op::SetLen => stats.set_lens += 1,
        }
        let mut effect = None;
        for a in armed.iter_mut().filter(|a| !a.done) {
            let nth = match (a.fault.target, &op) {
                (FaultTarget::Write { kind, nth }, Op::Write(k))
                | (FaultTarget::Read { kind, nth }, Op::Read(k))
                    if kind.is_none_or(|want| want == *k) =>
                {
                    nth
                }
                (FaultTarget::Sync { nth }, Op::Sync)
                | (FaultTarget::SetLen { nth }, Op::SetLen) => nth,
                _ => continue,
            };
            a.seen += 1;
            if a.seen == nth && effect.is_none() {
                a.done = true;
                effect = Some(a.fault.effect);
            }
        }
        if effect.is_some() {
            stats.fired += 1;
        }
        effect
    }
}

impl MetaIo for FaultyMetaIo {
    fn read_at(&self, kind: MetaKind, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match self.pick(Op::Read(kind)) {
            Some(FaultEffect::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
            Some(FaultEffect::ShortWrite) | None => self.inner.read_at(kind, buf, offset),
        }
    }

    fn write_at(&self, kind: MetaKind, buf: &[u8], offset: u64) -> io::Result<usize> {
        match self.pick(Op::Write(kind)) {
            Some(FaultEffect::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
            Some(FaultEffect::ShortWrite) if buf.len() > 1 => {
                self.inner.write_at(kind, &buf[..buf.len() / 2], offset)
            }
            _ => self.inner.write_at(kind, buf, offset),
        }
    }

    fn sync(&self) -> io::Result<()> {
        match self.pick(Op::Sync) {
            Some(FaultEffect::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
            _ => self.inner.sync(),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        match self.pick(Op::SetLen) {
            Some(FaultEffect::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
            _ => self.inner.set_len(len),
        }
    }
}
