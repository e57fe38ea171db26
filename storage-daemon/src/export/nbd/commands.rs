//! What each NBD command does to the image, and its answer.
//!
//! [`Commands::on_request`] turns a validated request into block requests
//! on the connection's queue (appended to the batch the connection
//! submits) or answers it at once (zero lengths, CACHE, BLOCK_STATUS,
//! FAST_ZERO that would not be fast). [`Commands::on_completion`] turns
//! each block completion into the reply; a write with FUA is followed by
//! a flush, and answered when that completes. A request the block layer
//! fails is answered and logged by [`failed`], through the same seam as
//! FUSE and virtio-blk.
//!
//! READ answers with one data chunk (structured) or the data after a
//! simple reply; successes without data get a simple reply, errors an
//! error chunk when structured replies were negotiated. CACHE is a hint
//! the protocol lets a server ignore, and is answered at once.
//! BLOCK_STATUS is the format's block status (`qemu-img map`'s source),
//! read inline: holes (no data) and zeroes, merged into extents.

use std::sync::Arc;

use block::{BlockError, BlockRequest, Completion, IoMemory, RequestOp};
use nbd::outbox::Outbox;
use nbd::server::{replies, Command, Request};
use nbd::wire::consts::{cmd_flag, error, state};
use nbd::wire::nbd_error_from_errno;

use super::shared::ExportShared;

/// Most extents in one BLOCK_STATUS answer (QEMU's server sends at most
/// 1 MiB of them).
const MAX_EXTENTS: usize = 1 << 17;

/// The answer to a request that failed in the block layer, as FUSE and
/// virtio-blk answer it: logged through the block crate's one log of
/// failed requests (at the error's level, rate-limited;
/// [`block::error_log`]), answered with the protocol's number for the
/// error's errno ([`BlockError::errno`]: the host's own where there is
/// one).
pub fn failed(request: std::fmt::Arguments<'_>, e: &BlockError) -> u32 {
    block::error_log::log_failed_request(request, e);
    nbd_error_from_errno(e.errno())
}

/// What a block request in flight answers.
enum Pending {
    Read {
        cookie: u64,
        offset: u64,
    },
    /// A write, trim or write-zeroes; `fua` asks for a flush first.
    Modify {
        cookie: u64,
        fua: bool,
    },
    Flush {
        cookie: u64,
    },
}

pub struct Commands {
    shared: Arc<ExportShared>,
    structured: bool,
    /// Requests in flight, indexed by the block request's `user_data`.
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    in_flight: usize,
}

impl Commands {
    pub fn new(shared: Arc<ExportShared>, structured: bool) -> Self {
        Commands {
            shared,
            structured,
            pending: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
        }
    }

    /// Block requests submitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn track(&mut self, p: Pending) -> u64 {
        self.in_flight += 1;
        match self.free.pop() {
            Some(i) => {
                self.pending[i] = Some(p);
                i as u64
            }
            None => {
                self.pending.push(Some(p));
                (self.pending.len() - 1) as u64
            }
        }
    }

    fn submit(
        &mut self,
        batch: &mut Vec<BlockRequest>,
        p: Pending,
        op: RequestOp,
        offset: u64,
        memory: IoMemory,
    ) {
        let user_data = self.track(p);
        batch.push(BlockRequest {
            user_data,
            op,
            offset,
            memory,
        });
    }

    /// Answers an invalid request.
    pub fn reject(&self, out: &mut Outbox, cookie: u64, error: u32, reason: &str) {
        log::debug!("nbd: request {cookie:#x} refused: {reason}");
        out.push_with(|b| replies::error(b, self.structured, cookie, error, reason));
    }

    pub fn on_request(&mut self, req: Request, batch: &mut Vec<BlockRequest>, out: &mut Outbox) {
        let cookie = req.cookie;
        let fua = req.has(cmd_flag::FUA);
        let len = u64::from(req.len);
        let ok = |out: &mut Outbox| out.push_with(|b| replies::ok(b, cookie));
        match req.command {
            Command::Read if len == 0 => {
                if self.structured {
                    out.push_with(|b| replies::done_chunk(b, cookie));
                } else {
                    ok(out);
                }
            }
            Command::Read => {
                let memory = IoMemory::Owned(vec![0; req.len as usize]);
                let p = Pending::Read {
                    cookie,
                    offset: req.offset,
                };
                self.submit(batch, p, RequestOp::Read, req.offset, memory);
            }
            Command::Write(data) if data.is_empty() => ok(out),
            Command::Write(data) => {
                let p = Pending::Modify { cookie, fua };
                self.submit(
                    batch,
                    p,
                    RequestOp::Write,
                    req.offset,
                    IoMemory::Owned(data),
                );
            }
            Command::Trim | Command::WriteZeroes if len == 0 => ok(out),
            Command::Trim => {
                let p = Pending::Modify { cookie, fua };
                self.submit(
                    batch,
                    p,
                    RequestOp::Discard { len },
                    req.offset,
                    IoMemory::None,
                );
            }
            Command::WriteZeroes => {
                let may_unmap = !req.has(cmd_flag::NO_HOLE);
                if req.has(cmd_flag::FAST_ZERO) && !self.zeroing_is_fast(req.offset, len, may_unmap)
                {
                    self.reject(
                        out,
                        cookie,
                        error::ENOTSUP,
                        "zeroing this range would write data",
                    );
                    return;
                }
                let p = Pending::Modify { cookie, fua };
                let op = RequestOp::WriteZeroes { len, may_unmap };
                self.submit(batch, p, op, req.offset, IoMemory::None);
            }
            Command::Flush => self.submit(
                batch,
                Pending::Flush { cookie },
                RequestOp::Flush,
                0,
                IoMemory::None,
            ),
            Command::Cache => ok(out),
            Command::BlockStatus => self.block_status(&req, out),
        }
    }

    /// FAST_ZERO: only zeroing that changes metadata, not data, is fast:
    /// whole qcow2 clusters, or a hole punched in a raw file.
    fn zeroing_is_fast(&self, offset: u64, len: u64, may_unmap: bool) -> bool {
        match self.shared.cluster_size {
            Some(cs) => {
                offset.is_multiple_of(cs)
                    && (len.is_multiple_of(cs) || offset + len == self.shared.desc.size)
            }
            None => may_unmap,
        }
    }

    fn block_status(&self, req: &Request, out: &mut Outbox) {
        let format = self.shared.disk.format();
        let one = req.has(cmd_flag::REQ_ONE);
        let mut extents: Vec<(u32, u32)> = Vec::new();
        let (mut at, end) = (req.offset, req.offset + u64::from(req.len));
        while at < end {
            let st = match format.block_status(at, end - at) {
                Ok(st) if st.len > 0 => st,
                Ok(_) => break,
                Err(e) => {
                    let cookie = req.cookie;
                    let code = failed(
                        format_args!("nbd: request {cookie:#x} (block status at {at})"),
                        &e,
                    );
                    let msg = format!("block status at {at}: {e}");
                    out.push_with(|b| replies::error(b, self.structured, cookie, code, &msg));
                    return;
                }
            };
            let flags =
                (if st.data { 0 } else { state::HOLE }) | (if st.zero { state::ZERO } else { 0 });
            let len = st.len.min(end - at) as u32;
            let full = extents.len() == MAX_EXTENTS || (one && !extents.is_empty());
            match extents.last_mut() {
                Some((l, f)) if *f == flags => *l += len,
                _ if full => break,
                _ => extents.push((len, flags)),
            }
            at += u64::from(len);
        }
        if extents.is_empty() {
            out.push_with(|b| {
                replies::error(
                    b,
                    self.structured,
                    req.cookie,
                    error::EIO,
                    "no block status",
                )
            });
            return;
        }
        out.push_with(|b| replies::block_status_chunk(b, req.cookie, 0, &extents));
    }

    /// Answers the request `c` completes (or submits its FUA flush).
    pub fn on_completion(
        &mut self,
        c: Completion,
        batch: &mut Vec<BlockRequest>,
        out: &mut Outbox,
    ) {
        let i = c.user_data as usize;
        let Some(p) = self.pending.get_mut(i).and_then(Option::take) else {
            log::error!("nbd: completion for unknown request {i}");
            return;
        };
        self.free.push(i);
        self.in_flight -= 1;
        let cookie = match p {
            Pending::Read { cookie, .. }
            | Pending::Modify { cookie, .. }
            | Pending::Flush { cookie } => cookie,
        };
        match (p, c.result) {
            (Pending::Read { offset, .. }, Ok(_)) => {
                let data = c.memory.into_owned().unwrap_or_default();
                let len = data.len() as u32;
                out.push_with(|b| {
                    if self.structured {
                        replies::data_chunk(b, cookie, offset, len, true);
                    } else {
                        replies::simple(b, cookie, 0);
                    }
                });
                out.push_owned(data);
            }
            (Pending::Modify { fua: true, .. }, Ok(_)) => {
                self.submit(
                    batch,
                    Pending::Flush { cookie },
                    RequestOp::Flush,
                    0,
                    IoMemory::None,
                );
            }
            (_, Ok(_)) => out.push_with(|b| replies::ok(b, cookie)),
            (_, Err(e)) => {
                let code = failed(format_args!("nbd: request {cookie:#x}"), &e);
                let msg = e.to_string();
                out.push_with(|b| replies::error(b, self.structured, cookie, code, &msg));
            }
        }
    }
}
