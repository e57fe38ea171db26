//! What each NBD command does to the image, and its answer.
//!
//! [`Commands::on_request`] turns a validated request into block requests
//! on the connection's queue (appended to the batch the connection
//! submits) or answers it at once (zero lengths, CACHE, BLOCK_STATUS,
//! FAST_ZERO that would not be fast). [`Commands::on_completion`] turns
//! each block completion into the reply; a write with FUA is followed by
//! a flush, and answered when that completes. A request the block layer
//! fails is answered and logged by `crate::answers`, through the same
//! seam as FUSE and virtio-blk.
//!
//! READ answers with one data chunk (structured) or the data after a
//! simple reply; successes without data get a simple reply, errors an
//! error chunk when structured replies were negotiated. CACHE is a hint
//! the protocol lets a server ignore, and is answered at once.
//! BLOCK_STATUS is answered inline, one chunk per selected context
//! (`crate::block_status`).

use std::sync::Arc;

use block::{BlockRequest, Completion, IoMemory, RequestOp};
use nbd::outbox::Outbox;
use nbd::server::{replies, Command, MetaContext, Request};
use nbd::wire::consts::{cmd_flag, error};

use crate::answers::answer_block_error;
use crate::shared::ExportShared;

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
    /// The metadata contexts the client selected.
    contexts: Vec<MetaContext>,
    /// Requests in flight, indexed by the block request's `user_data`.
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    in_flight: usize,
}

impl Commands {
    pub fn new(shared: Arc<ExportShared>, structured: bool, contexts: Vec<MetaContext>) -> Self {
        Commands {
            shared,
            structured,
            contexts,
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
                if req.has(cmd_flag::FAST_ZERO)
                    && !self
                        .shared
                        .source
                        .zeroing_is_fast(req.offset, len, may_unmap)
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
            Command::BlockStatus => crate::block_status::answer(
                &self.shared,
                &self.contexts,
                self.structured,
                &req,
                out,
            ),
        }
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
                let code = answer_block_error(format_args!("nbd: request {cookie:#x}"), &e);
                let msg = e.to_string();
                out.push_with(|b| replies::error(b, self.structured, cookie, code, &msg));
            }
        }
    }
}
