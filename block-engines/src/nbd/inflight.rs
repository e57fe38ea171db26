//! The commands a connection has in flight and the operations they
//! belong to.
//!
//! An operation (one engine op, or one blocking call) becomes one or more
//! NBD commands: reads and writes are split at the server's payload
//! limit, trims and zeroings at [`MAX_NON_DATA`]. Each command has a
//! cookie; the reply parser's events find it by cookie, READ data lands
//! in the operation's memory at the command's place in it, and the
//! operation completes (to its [`Sink`]) when its last command is done,
//! with the first error any of them met. Commands stay here until their
//! reply is done, so after a reconnection every one of them can be sent
//! again ([`Inflight::encode_all`]).

use std::collections::HashMap;
use std::io;

use nbd::client::{Expect, Extent, ReplyEvent};
use nbd::outbox::Outbox;
use nbd::wire::consts::cmd;
use nbd::wire::RequestHeader;

use super::iov::IovList;
use super::sink::{Outcome, Sink};

/// Longest TRIM or WRITE_ZEROES sent (a gigabyte, aligned).
pub(crate) const MAX_NON_DATA: u64 = 1 << 30;

/// What an operation asks of the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    /// Zeroes written as data (a server without WRITE_ZEROES).
    WriteZeroData,
    BlockStatus,
}

struct Op {
    sink: Sink,
    token: u64,
    /// Its owner went away: never touch its memory, never send again.
    orphan: bool,
    /// Commands not yet done.
    remaining: usize,
    errno: Option<i32>,
    bytes: u64,
    /// READ destination or WRITE source.
    iov: IovList,
    extents: Vec<Extent>,
}

struct Cmd {
    op: usize,
    /// A WRITE whose payload is zeroes, not the operation's memory.
    zero_data: bool,
    kind: u16,
    flags: u16,
    offset: u64,
    len: u32,
    /// Where the command's bytes start in the operation's memory.
    at: u64,
    /// READ bytes received (data and holes).
    covered: u64,
}

#[derive(Default)]
pub(crate) struct Inflight {
    ops: Vec<Option<Op>>,
    free: Vec<usize>,
    cmds: HashMap<u64, Cmd>,
    next_cookie: u64,
    /// The `base:allocation` context id, when negotiated.
    pub context: Option<u32>,
}

/// One operation to start.
pub(crate) struct OpRequest {
    pub sink: Sink,
    pub token: u64,
    pub kind: OpKind,
    pub offset: u64,
    pub len: u64,
    pub iov: IovList,
}

impl Inflight {
    pub fn new(context: Option<u32>) -> Self {
        Inflight {
            context,
            ..Default::default()
        }
    }

    /// Tables the operation's commands (split at `max_payload` for data)
    /// and returns their cookies; a zero-length operation has none and
    /// completes at once.
    pub fn add(&mut self, r: OpRequest, max_payload: u32) -> Vec<u64> {
        let (kind, piece) = match r.kind {
            OpKind::Read => (cmd::READ, u64::from(max_payload)),
            OpKind::Write | OpKind::WriteZeroData => (cmd::WRITE, u64::from(max_payload)),
            OpKind::Flush => (cmd::FLUSH, 0),
            OpKind::Trim => (cmd::TRIM, MAX_NON_DATA),
            OpKind::WriteZeroes => (cmd::WRITE_ZEROES, MAX_NON_DATA),
            OpKind::BlockStatus => (cmd::BLOCK_STATUS, MAX_NON_DATA),
        };
        let pieces: Vec<(u64, u64)> = if kind == cmd::FLUSH {
            vec![(0, 0)]
        } else if kind == cmd::BLOCK_STATUS {
            // One command: the answer may cover less, the caller asks again.
            vec![(0, r.len.min(piece))]
        } else {
            (0..r.len.div_ceil(piece))
                .map(|i| (i * piece, piece.min(r.len - i * piece)))
                .collect()
        };
        let bytes = if matches!(r.kind, OpKind::Read | OpKind::Write) {
            r.len
        } else {
            0
        };
        let zero_data = r.kind == OpKind::WriteZeroData;
        let op = Op {
            sink: r.sink,
            token: r.token,
            orphan: false,
            remaining: pieces.len(),
            errno: None,
            bytes,
            iov: r.iov,
            extents: Vec::new(),
        };
        let slot = match self.free.pop() {
            Some(i) => {
                self.ops[i] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                self.ops.len() - 1
            }
        };
        if pieces.is_empty() {
            self.finish(slot);
            return Vec::new();
        }
        pieces
            .into_iter()
            .map(|(at, len)| {
                self.next_cookie = self.next_cookie.wrapping_add(1);
                let cookie = self.next_cookie;
                let c = Cmd {
                    op: slot,
                    zero_data,
                    kind,
                    flags: 0,
                    offset: r.offset + at,
                    len: len as u32,
                    at,
                    covered: 0,
                };
                self.cmds.insert(cookie, c);
                cookie
            })
            .collect()
    }

    /// Queues the request (and a WRITE's payload) of `cookie` on `out`.
    pub fn encode(&self, cookie: u64, out: &mut Outbox) {
        let Some(c) = self.cmds.get(&cookie) else {
            return;
        };
        out.push_with(|b| RequestHeader::new(c.kind, c.flags, cookie, c.offset, c.len).encode(b));
        if c.kind == cmd::WRITE && c.zero_data {
            out.push_owned(vec![0; c.len as usize]);
        } else if c.kind == cmd::WRITE {
            if let Some(op) = self.ops.get(c.op).and_then(Option::as_ref) {
                // SAFETY: the op is in the table, so its engine op (or
                // blocking call) has not completed: its memory is alive.
                out.push_owned(unsafe { op.iov.copy_out(c.at, c.len as usize) });
            }
        }
    }

    /// Queues every command in flight again, oldest first (after a
    /// reconnection), and returns how many; the commands of orphaned
    /// operations are dropped.
    pub fn encode_all(&mut self, out: &mut Outbox) -> usize {
        let ops = &self.ops;
        let orphan = |c: &Cmd| {
            ops.get(c.op)
                .and_then(Option::as_ref)
                .is_none_or(|o| o.orphan)
        };
        let dropped: Vec<usize> = self
            .cmds
            .values()
            .filter(|c| orphan(c))
            .map(|c| c.op)
            .collect();
        self.cmds.retain(|_, c| !orphan(c));
        for slot in dropped {
            if let Some(op) = self.ops.get_mut(slot).and_then(Option::as_mut) {
                op.remaining -= 1;
                if op.remaining == 0 {
                    self.ops[slot] = None;
                    self.free.push(slot);
                }
            }
        }
        let mut cookies: Vec<u64> = self.cmds.keys().copied().collect();
        cookies.sort_unstable();
        for &c in &cookies {
            self.encode(c, out);
        }
        cookies.len()
    }

    /// What the reply parser should expect for `cookie`.
    pub fn expect(&self, cookie: u64) -> Option<Expect> {
        let c = self.cmds.get(&cookie)?;
        Some(match c.kind {
            cmd::READ => Expect::Read {
                offset: c.offset,
                len: c.len,
            },
            cmd::BLOCK_STATUS => Expect::BlockStatus {
                context: self.context.unwrap_or(u32::MAX),
            },
            _ => Expect::Other,
        })
    }

    /// Applies one parsed reply event.
    pub fn on_event(&mut self, ev: ReplyEvent<'_>) {
        let cookie = match ev {
            ReplyEvent::Data { cookie, .. }
            | ReplyEvent::Hole { cookie, .. }
            | ReplyEvent::Extents { cookie, .. }
            | ReplyEvent::Error { cookie, .. }
            | ReplyEvent::Done { cookie } => cookie,
        };
        let Some(c) = self.cmds.get_mut(&cookie) else {
            return;
        };
        let Some(op) = self.ops.get_mut(c.op).and_then(Option::as_mut) else {
            return;
        };
        match ev {
            ReplyEvent::Data { at, bytes, .. } => {
                // SAFETY: the op is in the table: its memory is alive and
                // the executor does not touch it until the completion.
                unsafe { op.iov.copy_in(c.at + at, bytes) };
                c.covered += bytes.len() as u64;
            }
            ReplyEvent::Hole { at, len, .. } => {
                // SAFETY: as above.
                unsafe { op.iov.zero(c.at + at, len as usize) };
                c.covered += u64::from(len);
            }
            ReplyEvent::Extents { extents, .. } => op.extents.extend_from_slice(extents),
            ReplyEvent::Error { errno, message, .. } => {
                if !message.is_empty() {
                    log::debug!("nbd: command {cookie:#x} failed on the server: {message}");
                }
                op.errno.get_or_insert(errno);
            }
            ReplyEvent::Done { .. } => {
                let c = self.cmds.remove(&cookie).expect("looked up above");
                let Some(op) = self.ops.get_mut(c.op).and_then(Option::as_mut) else {
                    return;
                };
                if c.kind == cmd::READ && op.errno.is_none() && c.covered != u64::from(c.len) {
                    log::warn!(
                        "nbd: the server answered {} of {} bytes of a read at {}",
                        c.covered,
                        c.len,
                        c.offset
                    );
                    op.errno = Some(libc::EIO);
                }
                if c.kind == cmd::BLOCK_STATUS && op.errno.is_none() && op.extents.is_empty() {
                    op.errno = Some(libc::EIO);
                }
                op.remaining -= 1;
                if op.remaining == 0 {
                    self.finish(c.op);
                }
            }
        }
    }

    fn finish(&mut self, slot: usize) {
        let Some(op) = self.ops.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free.push(slot);
        let result = match op.errno {
            Some(e) => Err(io::Error::from_raw_os_error(e)),
            None => Ok(op.bytes),
        };
        op.sink.deliver(Outcome {
            token: op.token,
            result,
            extents: op.extents,
        });
    }

    /// Fails the commands `cookies` (their operations complete with
    /// `errno` once none of their commands is left).
    pub fn fail_cmds(&mut self, cookies: &[u64], errno: i32) {
        for cookie in cookies {
            let Some(c) = self.cmds.remove(cookie) else {
                continue;
            };
            if let Some(op) = self.ops.get_mut(c.op).and_then(Option::as_mut) {
                op.errno.get_or_insert(errno);
                op.remaining -= 1;
                if op.remaining == 0 {
                    self.finish(c.op);
                }
            }
        }
    }

    /// Fails every operation in flight with `errno`.
    pub fn fail_all(&mut self, errno: i32) {
        self.cmds.clear();
        for slot in 0..self.ops.len() {
            if let Some(op) = self.ops[slot].as_mut() {
                op.errno.get_or_insert(errno);
                self.finish(slot);
            }
        }
    }

    /// Forgets the operations of `sink` without completing them: their
    /// memory is never touched again (replies to their commands are
    /// still parsed, and dropped).
    pub fn forget(&mut self, sink: &Sink) {
        for slot in 0..self.ops.len() {
            if self.ops[slot].as_ref().is_some_and(|op| op.sink.same(sink)) {
                if let Some(op) = self.ops[slot].as_mut() {
                    op.iov = IovList::empty();
                    op.orphan = true;
                    op.sink = Sink::Waiter(Default::default());
                }
            }
        }
    }
}
