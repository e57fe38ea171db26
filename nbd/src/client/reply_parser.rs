//! The transmission phase, client side: bytes from the server in, what
//! they say about each request out.
//!
//! The parser needs to know what a cookie was asked (a READ's range, a
//! BLOCK_STATUS, anything else): the caller answers through the `expect`
//! closure of [`ReplyParser::feed`], and gets [`ReplyEvent`]s through
//! `on`. READ data is handed over in pieces as it arrives (never
//! buffered whole), with its place in the request, so the caller copies
//! it straight to the request's memory. Every field a server sends is
//! checked before use: magic, cookie, chunk type for the command, chunk
//! length, offsets inside the request, context id. A violation is a
//! [`ReplyError`]: the connection cannot be trusted after it.

use thiserror::Error;

use crate::wire::consts::{chunk, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC};
use crate::wire::{be16, be32, be64, errno_from_nbd_error, ChunkHeader, SimpleReplyHeader};

/// Most extents accepted in one BLOCK_STATUS chunk (QEMU's server sends
/// at most 1 MiB of them).
pub const MAX_EXTENTS: u32 = 1 << 17;
/// Longest error message accepted.
const MAX_MESSAGE: u32 = 4096;

/// What the request a cookie names asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    Read { offset: u64, len: u32 },
    BlockStatus { context: u32 },
    Other,
}

/// One `base:allocation` (or other context) extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub len: u32,
    pub flags: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub enum ReplyEvent<'a> {
    /// READ data at `at` bytes from the start of the request.
    Data {
        cookie: u64,
        at: u64,
        bytes: &'a [u8],
    },
    /// `len` bytes at `at` from the start of the request read as zeroes.
    Hole { cookie: u64, at: u64, len: u32 },
    Extents {
        cookie: u64,
        context: u32,
        extents: &'a [Extent],
    },
    /// The request failed (`errno` is a Linux errno).
    Error {
        cookie: u64,
        errno: i32,
        message: &'a str,
    },
    /// The last piece of the reply.
    Done { cookie: u64 },
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReplyError {
    #[error("reply magic {0:#x}")]
    Magic(u32),
    #[error("reply for cookie {0:#x}, which is not in flight")]
    UnknownCookie(u64),
    #[error("structured reply chunk, but structured replies were not negotiated")]
    NotNegotiated,
    #[error("chunk type {kind} (flags {flags:#x}, {len} bytes) does not answer this request")]
    ChunkType { kind: u16, flags: u16, len: u32 },
    #[error("chunk type {kind} with a payload of {len} bytes")]
    ChunkLength { kind: u16, len: u32 },
    #[error("chunk covers {offset}+{len}, outside the request")]
    OutOfRange { offset: u64, len: u64 },
    #[error("block status for context {got}, but {want} was negotiated")]
    Context { got: u32, want: u32 },
    #[error("error chunk whose error value is 0")]
    ZeroError,
}

enum State {
    /// Reading a reply or chunk header.
    Header,
    /// A simple READ reply's data.
    SimpleData { cookie: u64, at: u64, left: u32 },
    /// The 8-byte offset of an OFFSET_DATA chunk.
    DataOffset {
        hdr: ChunkHeader,
        start: u64,
        len: u32,
    },
    /// An OFFSET_DATA chunk's data.
    ChunkData {
        cookie: u64,
        at: u64,
        left: u32,
        done: bool,
    },
    /// A chunk payload read whole (hole, block status, error).
    Payload { hdr: ChunkHeader, expect: Expect },
}

pub struct ReplyParser {
    structured: bool,
    state: State,
    /// Header or small-payload bytes gathered so far.
    buf: Vec<u8>,
    extents: Vec<Extent>,
}

impl ReplyParser {
    /// `structured`: structured replies were negotiated.
    pub fn new(structured: bool) -> Self {
        ReplyParser {
            structured,
            state: State::Header,
            buf: Vec::with_capacity(64),
            extents: Vec::new(),
        }
    }

    /// No reply is half read.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Header) && self.buf.is_empty()
    }

    /// Parses all of `input`.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        expect: &mut dyn FnMut(u64) -> Option<Expect>,
        on: &mut dyn FnMut(ReplyEvent<'_>),
    ) -> Result<(), ReplyError> {
        while !input.is_empty() {
            match self.state {
                State::Header => {
                    let want = if self.buf.len() < 4 {
                        4
                    } else if be32(&self.buf, 0) == SIMPLE_REPLY_MAGIC {
                        SimpleReplyHeader::SIZE
                    } else {
                        ChunkHeader::SIZE
                    };
                    if self.gather(&mut input, want) {
                        if want == 4 {
                            let magic = be32(&self.buf, 0);
                            if magic != SIMPLE_REPLY_MAGIC && magic != STRUCTURED_REPLY_MAGIC {
                                return Err(ReplyError::Magic(magic));
                            }
                        } else {
                            self.on_header(expect, on)?;
                        }
                    }
                }
                State::SimpleData { cookie, at, left }
                | State::ChunkData {
                    cookie, at, left, ..
                } => {
                    let n = (left as usize).min(input.len());
                    on(ReplyEvent::Data {
                        cookie,
                        at,
                        bytes: &input[..n],
                    });
                    input = &input[n..];
                    let left = left - n as u32;
                    let at = at + n as u64;
                    self.state = match self.state {
                        State::SimpleData { .. } if left == 0 => {
                            on(ReplyEvent::Done { cookie });
                            State::Header
                        }
                        State::SimpleData { .. } => State::SimpleData { cookie, at, left },
                        State::ChunkData { done, .. } if left == 0 => {
                            if done {
                                on(ReplyEvent::Done { cookie });
                            }
                            State::Header
                        }
                        State::ChunkData { done, .. } => State::ChunkData {
                            cookie,
                            at,
                            left,
                            done,
                        },
                        _ => unreachable!("matched above"),
                    };
                }
                State::DataOffset { hdr, start, len } => {
                    if self.gather(&mut input, 8) {
                        let offset = be64(&self.buf, 0);
                        self.buf.clear();
                        let data = hdr.len - 8;
                        let end = offset.checked_add(u64::from(data));
                        if offset < start || end.is_none_or(|e| e > start + u64::from(len)) {
                            return Err(ReplyError::OutOfRange {
                                offset,
                                len: u64::from(data),
                            });
                        }
                        self.state = State::ChunkData {
                            cookie: hdr.cookie,
                            at: offset - start,
                            left: data,
                            done: hdr.flags & chunk::FLAG_DONE != 0,
                        };
                    }
                }
                State::Payload { hdr, expect: ex } => {
                    if self.gather(&mut input, hdr.len as usize) {
                        self.on_payload(hdr, ex, on)?;
                        self.buf.clear();
                        self.state = State::Header;
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves bytes from `input` into `buf` until it holds `want`; true
    /// once it does.
    fn gather(&mut self, input: &mut &[u8], want: usize) -> bool {
        let n = want.saturating_sub(self.buf.len()).min(input.len());
        self.buf.extend_from_slice(&input[..n]);
        *input = &input[n..];
        self.buf.len() == want
    }

    fn on_header(
        &mut self,
        expect: &mut dyn FnMut(u64) -> Option<Expect>,
        on: &mut dyn FnMut(ReplyEvent<'_>),
    ) -> Result<(), ReplyError> {
        if be32(&self.buf, 0) == SIMPLE_REPLY_MAGIC {
            let h = SimpleReplyHeader::decode(&self.buf);
            self.buf.clear();
            let ex = expect(h.cookie).ok_or(ReplyError::UnknownCookie(h.cookie))?;
            if h.error != 0 {
                on(ReplyEvent::Error {
                    cookie: h.cookie,
                    errno: errno_from_nbd_error(h.error),
                    message: "",
                });
                on(ReplyEvent::Done { cookie: h.cookie });
                return Ok(());
            }
            match ex {
                Expect::Read { len, .. } if len > 0 => {
                    self.state = State::SimpleData {
                        cookie: h.cookie,
                        at: 0,
                        left: len,
                    };
                }
                _ => on(ReplyEvent::Done { cookie: h.cookie }),
            }
            return Ok(());
        }
        let h = ChunkHeader::decode(&self.buf);
        self.buf.clear();
        if !self.structured {
            return Err(ReplyError::NotNegotiated);
        }
        let ex = expect(h.cookie).ok_or(ReplyError::UnknownCookie(h.cookie))?;
        let wrong_type = || ReplyError::ChunkType {
            kind: h.kind,
            flags: h.flags,
            len: h.len,
        };
        let bad_len = || ReplyError::ChunkLength {
            kind: h.kind,
            len: h.len,
        };
        let done = h.flags & chunk::FLAG_DONE != 0;
        match (h.kind, ex) {
            (chunk::NONE, _) => {
                if h.len != 0 || !done {
                    return Err(wrong_type());
                }
                on(ReplyEvent::Done { cookie: h.cookie });
            }
            (chunk::OFFSET_DATA, Expect::Read { offset, len }) => {
                if h.len <= 8 || h.len - 8 > len {
                    return Err(bad_len());
                }
                self.state = State::DataOffset {
                    hdr: h,
                    start: offset,
                    len,
                };
            }
            (chunk::OFFSET_HOLE, Expect::Read { .. }) if h.len != 12 => return Err(bad_len()),
            (chunk::BLOCK_STATUS, Expect::BlockStatus { .. })
                if h.len < 12
                    || !(h.len - 4).is_multiple_of(8)
                    || (h.len - 4) / 8 > MAX_EXTENTS =>
            {
                return Err(bad_len())
            }
            (chunk::OFFSET_HOLE, Expect::Read { .. })
            | (chunk::BLOCK_STATUS, Expect::BlockStatus { .. }) => {
                self.state = State::Payload { hdr: h, expect: ex };
            }
            (k, _) if k & chunk::ERROR_BIT != 0 => {
                if h.len < 6 || h.len > 6 + MAX_MESSAGE + 8 {
                    return Err(bad_len());
                }
                self.state = State::Payload { hdr: h, expect: ex };
            }
            _ => return Err(wrong_type()),
        }
        Ok(())
    }

    fn on_payload(
        &mut self,
        h: ChunkHeader,
        ex: Expect,
        on: &mut dyn FnMut(ReplyEvent<'_>),
    ) -> Result<(), ReplyError> {
        let b = &self.buf;
        let bad_len = || ReplyError::ChunkLength {
            kind: h.kind,
            len: h.len,
        };
        match (h.kind, ex) {
            (chunk::OFFSET_HOLE, Expect::Read { offset, len }) => {
                let at = be64(b, 0);
                let size = be32(b, 8);
                let end = at.checked_add(u64::from(size));
                if size == 0 || at < offset || end.is_none_or(|e| e > offset + u64::from(len)) {
                    return Err(ReplyError::OutOfRange {
                        offset: at,
                        len: u64::from(size),
                    });
                }
                on(ReplyEvent::Hole {
                    cookie: h.cookie,
                    at: at - offset,
                    len: size,
                });
            }
            (chunk::BLOCK_STATUS, Expect::BlockStatus { context }) => {
                let got = be32(b, 0);
                if got != context {
                    return Err(ReplyError::Context { got, want: context });
                }
                self.extents.clear();
                self.extents.extend(b[4..].chunks_exact(8).map(|e| Extent {
                    len: be32(e, 0),
                    flags: be32(e, 4),
                }));
                on(ReplyEvent::Extents {
                    cookie: h.cookie,
                    context,
                    extents: &self.extents,
                });
            }
            (k, _) => {
                debug_assert!(k & chunk::ERROR_BIT != 0);
                let error = be32(b, 0);
                let mlen = u32::from(be16(b, 4));
                let tail = if k == chunk::ERROR_OFFSET { 8 } else { 0 };
                if mlen > MAX_MESSAGE
                    || 6 + mlen + tail > h.len
                    || (k == chunk::ERROR_OFFSET && 6 + mlen + tail != h.len)
                {
                    return Err(bad_len());
                }
                if error == 0 {
                    return Err(ReplyError::ZeroError);
                }
                let msg = String::from_utf8_lossy(&b[6..6 + mlen as usize]);
                on(ReplyEvent::Error {
                    cookie: h.cookie,
                    errno: errno_from_nbd_error(error),
                    message: &msg,
                });
            }
        }
        if h.flags & chunk::FLAG_DONE != 0 {
            on(ReplyEvent::Done { cookie: h.cookie });
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "reply_parser_tests.rs"]
mod tests;
