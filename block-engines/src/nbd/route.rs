//! [`RoutedEngine`]: a queue's engine when its image has NBD files. Ops
//! on the image's local files go to the queue's file engine (io_uring,
//! AIO, threads or sync), ops on an NBD file to that export's
//! [`NbdEngine`]; all of them complete through the queue's one eventfd.
//!
//! File ids say where an op goes: the local files are `0..n` (the file
//! engine's own numbering, unchanged), the NBD files `n..` in the order of
//! [`crate::files::ImageFiles::remote_files`].

use std::os::fd::AsRawFd;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::engine::NbdEngine;
use crate::error::BlockError;
use crate::FileId;
use crate::{Engine, EngineCompletion, HostOp, OpToken};

pub(crate) struct RoutedEngine {
    local: Box<dyn Engine>,
    local_files: usize,
    remote: Vec<NbdEngine>,
}

fn file_of(op: &HostOp) -> FileId {
    match op {
        HostOp::Readv { file, .. }
        | HostOp::Writev { file, .. }
        | HostOp::Fdatasync { file }
        | HostOp::PunchHole { file, .. }
        | HostOp::ZeroRange { file, .. } => *file,
    }
}

impl RoutedEngine {
    pub fn new(local: Box<dyn Engine>, local_files: usize, remote: Vec<NbdEngine>) -> Self {
        RoutedEngine {
            local,
            local_files,
            remote,
        }
    }

    fn remote_in_flight(&self) -> usize {
        self.remote.iter().map(|r| r.in_flight()).sum()
    }

    fn reap_all(&mut self, out: &mut Vec<EngineCompletion>) {
        self.local.reap(out);
        for r in &mut self.remote {
            r.reap(out);
        }
    }
}

impl Engine for RoutedEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        let i = usize::from(file_of(&op).0);
        if i < self.local_files {
            // SAFETY: the caller's promise passes on unchanged.
            return unsafe { self.local.push(token, op) };
        }
        match self.remote.get_mut(i - self.local_files) {
            // SAFETY: as above.
            Some(r) => unsafe { r.push(token, op) },
            None => Err(BlockError::NoSuchFile(i as u16)),
        }
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        for r in &mut self.remote {
            r.submit()?;
        }
        self.local.submit()
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        self.reap_all(out);
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        let remote = self.remote_in_flight();
        if remote == 0 {
            return self.local.wait(out);
        }
        if self.local.in_flight() == 0 && self.remote.len() == 1 {
            return self.remote[0].wait(out);
        }
        for r in &mut self.remote {
            r.submit()?;
        }
        let start = out.len();
        loop {
            self.reap_all(out);
            if out.len() > start || self.in_flight() == 0 {
                return Ok(());
            }
            wait_readable(self.local.eventfd())?;
        }
    }

    fn in_flight(&self) -> usize {
        self.local.in_flight() + self.remote_in_flight()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        self.local.eventfd()
    }

    fn writes_at_submit(&self) -> bool {
        self.local.writes_at_submit()
    }

    fn allow_writes_at_submit(&mut self) {
        self.local.allow_writes_at_submit();
    }
}

/// Waits until `fd` is readable and clears it, with epoll (which the
/// VMM's queue threads may use; poll they may not).
fn wait_readable(fd: &EventFd) -> Result<(), BlockError> {
    let err = |_| BlockError::EventFd(std::io::Error::last_os_error());
    // SAFETY: epoll_create1 takes no pointers.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(err(()));
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: `ev` is a valid epoll_event; `ep` and `fd` are open.
    let mut r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) };
    if r == 0 {
        loop {
            // SAFETY: `ev` has room for the one event asked for.
            r = unsafe { libc::epoll_wait(ep, &mut ev, 1, -1) };
            if r >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
    }
    let result = if r < 0 { Err(err(())) } else { Ok(()) };
    // SAFETY: `ep` is ours and closed once.
    unsafe { libc::close(ep) };
    let _ = fd.read();
    result
}
