//! [`NbdFile`]: an NBD export as a file of an image chain. It holds the
//! export's first connection (opened at open, where errors can still be
//! reported), hands each queue an [`NbdEngine`], and serves the blocking
//! reads and block status the formats need inline.
//!
//! Queues share the first connection, unless the server advertises
//! multi-conn: then each queue gets a connection of its own (a FLUSH on
//! any of them covers writes completed on all, which is what multi-conn
//! promises). Every connection, the first and the queues' own, is opened
//! through [`super::connector`]: the thread that opens an image or
//! creates a queue may run under a seccomp filter that allows no `socket`
//! or `connect` (the VMM's control loop, vCPU and queue threads). A queue
//! whose own connection cannot be opened shares the first one.

use std::sync::Arc;
use std::time::Duration;

use nbd::client::{ClientConfig, ExportInfo, Extent, NbdUri};
use nbd::wire::consts::flag;
use vmm_sys_util::eventfd::EventFd;

use super::connection::Connection;
use super::engine::NbdEngine;
use super::inflight::{OpKind, OpRequest};
use super::iov::IovList;
use super::link::Target;
use super::sink::{Sink, Waiter};
use crate::error::BlockError;
use crate::RawIovecs;

pub struct NbdFile {
    target: Target,
    first: Arc<Connection>,
    info: ExportInfo,
    /// Whether each queue gets a connection of its own (multi-conn).
    per_queue: bool,
}

impl std::fmt::Debug for NbdFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NbdFile({})", self.target.uri)
    }
}

impl NbdFile {
    /// Connects to the export `path` names (an NBD URI), with QEMU's
    /// `reconnect-delay` of `reconnect_delay`. Errors name `path` as the
    /// caller spelled it.
    pub fn connect(path: &str, reconnect_delay: Duration) -> Result<Arc<NbdFile>, BlockError> {
        let uri = NbdUri::parse(path).map_err(|e| BlockError::Nbd {
            uri: path.to_string(),
            reason: e.reason,
        })?;
        NbdFile::open(Target {
            cfg: ClientConfig {
                export: uri.export.clone(),
                structured: true,
                block_status: true,
            },
            uri,
            reconnect_delay,
        })
        .map_err(|e| match e {
            BlockError::NbdConnect { source, .. } => BlockError::NbdConnect {
                uri: path.to_string(),
                source,
            },
            e => e,
        })
    }

    fn open(target: Target) -> Result<Arc<NbdFile>, BlockError> {
        let uri = target.uri.to_string();
        let first = super::connector::open(target.clone()).map_err(|e| BlockError::NbdConnect {
            uri: uri.clone(),
            source: Box::new(e),
        })?;
        let info = first.info();
        let per_queue = info.has(flag::CAN_MULTI_CONN);
        log::info!(
            "nbd: {uri}: {} bytes, {}{}",
            info.size,
            if info.read_only() {
                "read-only"
            } else {
                "writable"
            },
            if per_queue {
                ", multi-conn: one connection per queue"
            } else {
                ""
            }
        );
        Ok(Arc::new(NbdFile {
            target,
            first: Arc::new(first),
            info,
            per_queue,
        }))
    }

    pub fn uri(&self) -> &NbdUri {
        &self.target.uri
    }

    /// The export's name in messages: its URI, as every log line of
    /// the client writes it.
    pub fn name(&self) -> String {
        self.target.uri.to_string()
    }

    pub fn size(&self) -> u64 {
        self.info.size
    }

    pub fn read_only(&self) -> bool {
        self.info.read_only()
    }

    pub fn has_block_status(&self) -> bool {
        self.info.base_allocation.is_some()
    }

    /// An engine for one queue, completing to `eventfd`.
    pub(crate) fn queue_engine(&self, eventfd: Arc<EventFd>) -> NbdEngine {
        NbdEngine::new(self.queue_connection(), eventfd)
    }

    fn queue_connection(&self) -> Arc<Connection> {
        if !self.per_queue {
            return self.first.clone();
        }
        match super::connector::open(self.target.clone()) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                let cause = std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                log::warn!(
                    "nbd: {}: no connection of its own for a queue ({e}{cause}); it shares the first",
                    self.target.uri
                );
                self.first.clone()
            }
        }
    }

    /// Runs one operation on the first connection and waits for it.
    fn blocking(&self, kind: OpKind, offset: u64, len: u64, iov: IovList) -> super::sink::Outcome {
        let waiter = Arc::new(Waiter::default());
        self.first.submit(OpRequest {
            sink: Sink::Waiter(waiter.clone()),
            token: 0,
            kind,
            offset,
            len,
            iov,
        });
        self.first.flush();
        waiter.wait()
    }

    /// Reads `buf.len()` bytes at `offset` (inline copy-on-write reads).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        let raw = RawIovecs {
            ptr: iov.as_ptr(),
            count: 1,
        };
        // SAFETY: `iov` names `buf`, which this call borrows mutably until
        // the operation has completed (`blocking` waits for it).
        let list = unsafe { IovList::from_raw(&raw) };
        self.blocking(OpKind::Read, offset, buf.len() as u64, list)
            .result
            .map(|_| ())
            .map_err(|source| BlockError::Read { offset, source })
    }

    /// Writes `buf` at `offset` and waits for the server's answer (tool
    /// work that is not a queue's: `create` zeroing the first sector).
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        let iov = [libc::iovec {
            iov_base: buf.as_ptr().cast_mut().cast(),
            iov_len: buf.len(),
        }];
        let raw = RawIovecs {
            ptr: iov.as_ptr(),
            count: 1,
        };
        // SAFETY: `iov` names `buf`, which this call borrows until the
        // operation has completed (`blocking` waits for it); a WRITE only
        // reads its memory (the payload is copied when it is submitted).
        let list = unsafe { IovList::from_raw(&raw) };
        self.blocking(OpKind::Write, offset, buf.len() as u64, list)
            .result
            .map(|_| ())
            .map_err(|source| BlockError::Write { offset, source })
    }

    /// Asks the server to make every completed write durable (FLUSH).
    pub fn flush(&self) -> Result<(), BlockError> {
        self.blocking(OpKind::Flush, 0, 0, IovList::empty())
            .result
            .map(|_| ())
            .map_err(BlockError::Flush)
    }

    /// `base:allocation` extents from `offset` (at least one, covering at
    /// most `len` bytes as the server chose).
    pub fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        let o = self.blocking(OpKind::BlockStatus, offset, len, IovList::empty());
        o.result.map_err(|source| BlockError::MetadataRead {
            what: format!("block status of {} at {offset}", self.target.uri),
            source,
        })?;
        Ok(o.extents)
    }
}
