//! The transmission phase, server side: bytes from the client in,
//! validated requests out.
//!
//! [`RequestParser::feed`] takes whatever arrived (any split: a header
//! may arrive a byte at a time, a WRITE payload in many pieces) and
//! appends one [`Parsed`] per complete request. Checks follow QEMU's
//! server: a wrong magic ends the connection ([`ProtocolViolation`]);
//! DISC asks to close; a WRITE longer than the payload limit is answered
//! with EINVAL and then the connection closes (its payload cannot be
//! skipped safely); everything else that is wrong (unknown command or
//! flags, read-only export, a range past the end, block status not
//! negotiated) is rejected with the protocol's error and the client may
//! go on. A WRITE's payload is read before its request is judged, so a
//! rejected write never desynchronises the stream.

use thiserror::Error;

use crate::wire::consts::{cmd, cmd_flag, error, REQUEST_MAGIC};
use crate::wire::RequestHeader;

/// What the export allows, fixed at the end of the handshake.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    pub size: u64,
    pub writable: bool,
    /// Structured replies were negotiated (DF is a valid READ flag).
    pub structured: bool,
    /// At least one metadata context was selected (BLOCK_STATUS is
    /// allowed).
    pub block_status: bool,
    /// Largest READ/WRITE/CACHE length.
    pub max_payload: u32,
}

/// One command, validated against [`Rules`].
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Read,
    Write(Vec<u8>),
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub cookie: u64,
    pub flags: u16,
    pub offset: u64,
    pub len: u32,
    pub command: Command,
}

impl Request {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Request(Request),
    /// Answer `cookie` with `error`; when `close`, close the connection
    /// after the answer (the stream cannot be followed any more).
    Reject {
        cookie: u64,
        error: u32,
        reason: String,
        close: bool,
    },
    /// NBD_CMD_DISC: finish what is in flight, then close.
    Disconnect,
}

/// The client broke the framing; close without an answer.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtocolViolation {
    #[error("request magic {0:#x} is wrong")]
    Magic(u32),
    #[error("bytes after a request that ended the connection")]
    AfterClose,
}

enum State {
    Header,
    /// Reading a WRITE's payload; `verdict` is known once it is read.
    Payload {
        hdr: RequestHeader,
        data: Vec<u8>,
    },
    /// DISC or a fatal rejection was seen; nothing more is accepted.
    Closed,
}

pub struct RequestParser {
    rules: Rules,
    state: State,
    header: [u8; RequestHeader::SIZE],
    have: usize,
}

impl RequestParser {
    pub fn new(rules: Rules) -> Self {
        RequestParser {
            rules,
            state: State::Header,
            header: [0; RequestHeader::SIZE],
            have: 0,
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Bytes of the request being read (a header or payload in pieces).
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Header) && self.have == 0
    }

    /// Parses every byte of `input`, appending complete requests to `out`.
    pub fn feed(
        &mut self,
        mut input: &[u8],
        out: &mut Vec<Parsed>,
    ) -> Result<(), ProtocolViolation> {
        while !input.is_empty() {
            match &mut self.state {
                State::Closed => return Err(ProtocolViolation::AfterClose),
                State::Header => {
                    let n = (RequestHeader::SIZE - self.have).min(input.len());
                    self.header[self.have..self.have + n].copy_from_slice(&input[..n]);
                    self.have += n;
                    input = &input[n..];
                    if self.have == RequestHeader::SIZE {
                        self.have = 0;
                        let hdr = RequestHeader::decode(&self.header);
                        self.on_header(hdr, out)?;
                    }
                }
                State::Payload { hdr, data } => {
                    let want = hdr.len as usize - data.len();
                    let n = want.min(input.len());
                    data.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    if data.len() == hdr.len as usize {
                        let State::Payload { hdr, data } =
                            std::mem::replace(&mut self.state, State::Header)
                        else {
                            unreachable!("matched above")
                        };
                        out.push(self.judge(hdr, Command::Write(data)));
                    }
                }
            }
        }
        Ok(())
    }

    fn on_header(
        &mut self,
        hdr: RequestHeader,
        out: &mut Vec<Parsed>,
    ) -> Result<(), ProtocolViolation> {
        if hdr.magic != REQUEST_MAGIC {
            self.state = State::Closed;
            return Err(ProtocolViolation::Magic(hdr.magic));
        }
        match hdr.kind {
            cmd::DISC => {
                self.state = State::Closed;
                out.push(Parsed::Disconnect);
            }
            cmd::WRITE if hdr.len > self.rules.max_payload => {
                self.state = State::Closed;
                out.push(Parsed::Reject {
                    cookie: hdr.cookie,
                    error: error::EINVAL,
                    reason: format!(
                        "WRITE of {} bytes is over the limit of {}",
                        hdr.len, self.rules.max_payload
                    ),
                    close: true,
                });
            }
            cmd::WRITE if hdr.len > 0 => {
                self.state = State::Payload {
                    hdr,
                    data: Vec::with_capacity(hdr.len as usize),
                };
            }
            cmd::WRITE => out.push(self.judge(hdr, Command::Write(Vec::new()))),
            _ => {
                let command = match hdr.kind {
                    cmd::READ => Command::Read,
                    cmd::FLUSH => Command::Flush,
                    cmd::TRIM => Command::Trim,
                    cmd::CACHE => Command::Cache,
                    cmd::WRITE_ZEROES => Command::WriteZeroes,
                    cmd::BLOCK_STATUS => Command::BlockStatus,
                    other => {
                        out.push(reject(
                            hdr.cookie,
                            error::EINVAL,
                            format!("unknown command {other}"),
                        ));
                        return Ok(());
                    }
                };
                out.push(self.judge(hdr, command));
            }
        }
        Ok(())
    }

    /// Checks a complete request against the rules.
    fn judge(&self, hdr: RequestHeader, command: Command) -> Parsed {
        let r = &self.rules;
        let mut valid_flags = cmd_flag::FUA;
        let (payload_limited, modifies) = match command {
            Command::Read => {
                if r.structured {
                    valid_flags |= cmd_flag::DF;
                }
                (true, false)
            }
            Command::Write(_) => (true, true),
            Command::Cache => (true, false),
            Command::Flush => (false, false),
            Command::Trim => (false, true),
            Command::WriteZeroes => {
                valid_flags |= cmd_flag::NO_HOLE | cmd_flag::FAST_ZERO;
                (false, true)
            }
            Command::BlockStatus => {
                valid_flags |= cmd_flag::REQ_ONE;
                (false, false)
            }
        };
        let c = hdr.cookie;
        if payload_limited && hdr.len > r.max_payload {
            return reject(
                c,
                error::EINVAL,
                format!("length {} is over the limit of {}", hdr.len, r.max_payload),
            );
        }
        if modifies && !r.writable {
            return reject(c, error::EPERM, "the export is read-only".into());
        }
        let len = u64::from(hdr.len);
        if hdr.offset > r.size || len > r.size - hdr.offset {
            let err = match command {
                Command::Write(_) | Command::WriteZeroes => error::ENOSPC,
                _ => error::EINVAL,
            };
            return reject(
                c,
                err,
                format!(
                    "range {}+{} is past the end ({})",
                    hdr.offset, hdr.len, r.size
                ),
            );
        }
        if hdr.flags & !valid_flags != 0 {
            return reject(
                c,
                error::EINVAL,
                format!("flags {:#x} are not valid here", hdr.flags),
            );
        }
        if command == Command::BlockStatus {
            if !r.block_status {
                return reject(c, error::EINVAL, "block status was not negotiated".into());
            }
            if hdr.len == 0 {
                return reject(c, error::EINVAL, "block status needs a length".into());
            }
        }
        Parsed::Request(Request {
            cookie: c,
            flags: hdr.flags,
            offset: hdr.offset,
            len: hdr.len,
            command,
        })
    }
}

fn reject(cookie: u64, error: u32, reason: String) -> Parsed {
    Parsed::Reject {
        cookie,
        error,
        reason,
        close: false,
    }
}

#[cfg(test)]
#[path = "request_parser_tests.rs"]
mod tests;
