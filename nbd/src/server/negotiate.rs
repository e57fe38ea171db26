//! The server's fixed-newstyle handshake: options until OPT_GO or
//! OPT_EXPORT_NAME (or OPT_ABORT), one export per listener.
//!
//! Options answered: EXPORT_NAME, ABORT, LIST, STARTTLS (refused: no
//! TLS), INFO, GO (export size and flags, block sizes, name and
//! description), STRUCTURED_REPLY, LIST_META_CONTEXT and
//! SET_META_CONTEXT (`base:allocation` and the export's
//! `qemu:dirty-bitmap:NAME` contexts, matched by [`super::meta_context`]);
//! any other option gets
//! `NBD_REP_ERR_UNSUP` and the client may go on. A client that breaks the
//! framing (wrong magic, unknown client flags, an option longer than
//! [`MAX_OPTION_LEN`]) is disconnected, as QEMU's server does.

use std::io::{self, Read, Write};

use thiserror::Error;

use super::meta_context::{MetaContext, Selection};
use crate::wire::consts::{handshake, info, opt, rep, IHAVEOPT, MAX_STRING, NBD_MAGIC};
use crate::wire::{be16, be32, put_string, OptionHeader, OptionReplyHeader};

/// Longest option data accepted; longer options end the connection.
pub const MAX_OPTION_LEN: u32 = 64 << 10;

/// What the server offers under one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportDesc {
    pub name: String,
    pub description: Option<String>,
    pub size: u64,
    /// Transmission flags (`HAS_FLAGS` and the rest; `SEND_DF` is added
    /// for clients that negotiate structured replies).
    pub flags: u16,
    /// Minimum, preferred and maximum block size.
    pub block_sizes: [u32; 3],
}

/// What a client negotiated before it entered the transmission phase.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Session {
    pub structured: bool,
    /// `base:allocation` was selected (context id 0).
    pub base_allocation: bool,
    /// The offered bitmaps whose `qemu:dirty-bitmap:NAME` context was
    /// selected (indexes into the names given to
    /// [`negotiate_offering_bitmaps`]), in that order.
    pub bitmaps: Vec<u32>,
    /// The transmission flags the client was told.
    pub flags: u16,
}

impl Session {
    /// The selected contexts, in the order their BLOCK_STATUS chunks are
    /// sent: `base:allocation` first, then the bitmaps.
    pub fn contexts(&self) -> Vec<MetaContext> {
        let base = self.base_allocation.then_some(MetaContext::BaseAllocation);
        base.into_iter()
            .chain(self.bitmaps.iter().map(|&n| MetaContext::DirtyBitmap(n)))
            .collect()
    }

    /// At least one context was selected: BLOCK_STATUS may be used.
    pub fn block_status(&self) -> bool {
        self.base_allocation || !self.bitmaps.is_empty()
    }

    fn select(&mut self, contexts: &[MetaContext]) {
        self.base_allocation = contexts.contains(&MetaContext::BaseAllocation);
        self.bitmaps = contexts
            .iter()
            .filter_map(|c| match c {
                MetaContext::DirtyBitmap(n) => Some(*n),
                MetaContext::BaseAllocation => None,
            })
            .collect();
    }
}

#[derive(Debug)]
pub enum Negotiated {
    /// Transmission phase starts.
    Go(Session),
    /// The client sent OPT_ABORT.
    Aborted,
}

#[derive(Debug, Error)]
pub enum HandshakeError {
    #[error("handshake I/O")]
    Io(#[from] io::Error),
    #[error("unknown client flags {0:#x}")]
    ClientFlags(u32),
    #[error("option magic {0:#x} is not IHAVEOPT")]
    Magic(u64),
    #[error("option {option} carries {len} bytes (at most {MAX_OPTION_LEN})")]
    OptionTooLong { option: u32, len: u32 },
    #[error("OPT_EXPORT_NAME for unknown export '{0}'")]
    UnknownExport(String),
    #[error("option {0} needs fixed newstyle negotiation")]
    NotFixedNewstyle(u32),
}

/// Runs the handshake on `stream` for `export`, offering
/// `base:allocation` as its only metadata context.
pub fn negotiate<S: Read + Write>(
    stream: &mut S,
    export: &ExportDesc,
) -> Result<Negotiated, HandshakeError> {
    negotiate_offering_bitmaps(stream, export, &[])
}

/// Runs the handshake on `stream` for `export`, offering
/// `base:allocation` and a `qemu:dirty-bitmap:NAME` context for each of
/// `bitmaps` (names of at most [`MAX_STRING`] bytes with the prefix).
pub fn negotiate_offering_bitmaps<S: Read + Write>(
    stream: &mut S,
    export: &ExportDesc,
    bitmaps: &[String],
) -> Result<Negotiated, HandshakeError> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBD_MAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(handshake::FIXED_NEWSTYLE | handshake::NO_ZEROES).to_be_bytes());
    stream.write_all(&hello)?;
    stream.flush()?;

    let mut flags = [0u8; 4];
    stream.read_exact(&mut flags)?;
    let flags = u32::from_be_bytes(flags);
    let known = u32::from(handshake::FIXED_NEWSTYLE | handshake::NO_ZEROES);
    if flags & !known != 0 {
        return Err(HandshakeError::ClientFlags(flags));
    }
    let mut n = Negotiation {
        export,
        bitmaps,
        fixed: flags & u32::from(handshake::FIXED_NEWSTYLE) != 0,
        no_zeroes: flags & u32::from(handshake::NO_ZEROES) != 0,
        session: Session::default(),
        out: Vec::new(),
    };
    loop {
        let mut hdr = [0u8; OptionHeader::SIZE];
        stream.read_exact(&mut hdr)?;
        let hdr = OptionHeader::decode(&hdr);
        if hdr.magic != IHAVEOPT {
            return Err(HandshakeError::Magic(hdr.magic));
        }
        if hdr.len > MAX_OPTION_LEN {
            return Err(HandshakeError::OptionTooLong {
                option: hdr.option,
                len: hdr.len,
            });
        }
        let mut data = vec![0u8; hdr.len as usize];
        stream.read_exact(&mut data)?;
        let step = n.option(hdr.option, &data)?;
        let sent = stream.write_all(&n.out).and_then(|()| stream.flush());
        n.out.clear();
        match step {
            // The client may hang up without reading the ACK.
            Step::Abort => return Ok(Negotiated::Aborted),
            Step::Next => sent?,
            Step::Go => {
                sent?;
                return Ok(Negotiated::Go(n.session));
            }
        }
    }
}

enum Step {
    Next,
    Go,
    Abort,
}

struct Negotiation<'a> {
    export: &'a ExportDesc,
    bitmaps: &'a [String],
    fixed: bool,
    no_zeroes: bool,
    session: Session,
    /// Replies to the current option.
    out: Vec<u8>,
}

/// Reads a `u32`-length-prefixed string at `*at` of `data`.
fn take_string<'d>(data: &'d [u8], at: &mut usize) -> Option<&'d [u8]> {
    let len = data.get(*at..*at + 4).map(|b| be32(b, 0) as usize)?;
    let s = data.get(*at + 4..(*at + 4).checked_add(len)?)?;
    *at += 4 + len;
    Some(s)
}

impl Negotiation<'_> {
    fn option(&mut self, option: u32, data: &[u8]) -> Result<Step, HandshakeError> {
        if !self.fixed && option != opt::EXPORT_NAME {
            return Err(HandshakeError::NotFixedNewstyle(option));
        }
        match option {
            opt::EXPORT_NAME => self.export_name(data),
            opt::ABORT => {
                self.reply(option, rep::ACK, &[]);
                Ok(Step::Abort)
            }
            opt::LIST if !data.is_empty() => {
                self.error(option, rep::ERR_INVALID, "OPT_LIST takes no data")
            }
            opt::LIST => {
                let mut entry = Vec::new();
                put_string(&mut entry, self.export.name.as_bytes());
                if let Some(d) = &self.export.description {
                    entry.extend_from_slice(d.as_bytes());
                }
                self.reply(option, rep::SERVER, &entry);
                self.reply(option, rep::ACK, &[]);
                Ok(Step::Next)
            }
            opt::STARTTLS if !data.is_empty() => {
                self.error(option, rep::ERR_INVALID, "OPT_STARTTLS takes no data")
            }
            opt::STARTTLS => self.error(option, rep::ERR_POLICY, "TLS not configured"),
            opt::INFO | opt::GO => self.info(option, data),
            opt::STRUCTURED_REPLY if !data.is_empty() => self.error(
                option,
                rep::ERR_INVALID,
                "OPT_STRUCTURED_REPLY takes no data",
            ),
            opt::STRUCTURED_REPLY if self.session.structured => self.error(
                option,
                rep::ERR_INVALID,
                "structured replies already negotiated",
            ),
            opt::STRUCTURED_REPLY => {
                self.session.structured = true;
                self.reply(option, rep::ACK, &[]);
                Ok(Step::Next)
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => self.meta_context(option, data),
            _ => self.error(
                option,
                rep::ERR_UNSUP,
                &format!("option {option} is not supported"),
            ),
        }
    }

    fn reply(&mut self, option: u32, reply: u32, data: &[u8]) {
        OptionReplyHeader::new(option, reply, data.len() as u32).encode(&mut self.out);
        self.out.extend_from_slice(data);
    }

    fn error(&mut self, option: u32, reply: u32, msg: &str) -> Result<Step, HandshakeError> {
        log::debug!("nbd handshake: option {option} refused: {msg}");
        self.reply(option, reply, msg.as_bytes());
        Ok(Step::Next)
    }

    fn flags(&self) -> u16 {
        let df = if self.session.structured {
            crate::wire::consts::flag::SEND_DF
        } else {
            0
        };
        self.export.flags | df
    }

    fn export_name(&mut self, data: &[u8]) -> Result<Step, HandshakeError> {
        if data != self.export.name.as_bytes() {
            let shown = String::from_utf8_lossy(&data[..data.len().min(80)]).into_owned();
            return Err(HandshakeError::UnknownExport(shown));
        }
        self.session.flags = self.flags();
        self.out.extend_from_slice(&self.export.size.to_be_bytes());
        self.out
            .extend_from_slice(&self.session.flags.to_be_bytes());
        if !self.no_zeroes {
            self.out.extend_from_slice(&[0u8; 124]);
        }
        Ok(Step::Go)
    }

    fn info(&mut self, option: u32, data: &[u8]) -> Result<Step, HandshakeError> {
        let mut at = 0;
        let Some(name) = take_string(data, &mut at) else {
            return self.error(option, rep::ERR_INVALID, "inconsistent lengths in option");
        };
        if name.len() > MAX_STRING {
            return self.error(option, rep::ERR_INVALID, "export name too long");
        }
        let Some(count) = data.get(at..at + 2).map(|b| be16(b, 0) as usize) else {
            return self.error(option, rep::ERR_INVALID, "inconsistent lengths in option");
        };
        at += 2;
        if data.len() != at + 2 * count {
            return self.error(option, rep::ERR_INVALID, "inconsistent lengths in option");
        }
        let requests: Vec<u16> = (0..count).map(|i| be16(data, at + 2 * i)).collect();
        if name != self.export.name.as_bytes() {
            let shown = String::from_utf8_lossy(&name[..name.len().min(80)]).into_owned();
            return self.error(
                option,
                rep::ERR_UNKNOWN,
                &format!("export '{shown}' not present"),
            );
        }
        if requests.contains(&info::NAME) {
            let mut b = info::NAME.to_be_bytes().to_vec();
            b.extend_from_slice(self.export.name.as_bytes());
            self.reply(option, rep::INFO, &b);
        }
        if let Some(d) = &self.export.description {
            let mut b = info::DESCRIPTION.to_be_bytes().to_vec();
            b.extend_from_slice(d.as_bytes());
            self.reply(option, rep::INFO, &b);
        }
        let mut b = info::BLOCK_SIZE.to_be_bytes().to_vec();
        for s in self.export.block_sizes {
            b.extend_from_slice(&s.to_be_bytes());
        }
        self.reply(option, rep::INFO, &b);
        let flags = self.flags();
        let mut b = info::EXPORT.to_be_bytes().to_vec();
        b.extend_from_slice(&self.export.size.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        self.reply(option, rep::INFO, &b);
        self.reply(option, rep::ACK, &[]);
        if option == opt::GO {
            self.session.flags = flags;
            return Ok(Step::Go);
        }
        Ok(Step::Next)
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) -> Result<Step, HandshakeError> {
        let set = option == opt::SET_META_CONTEXT;
        if set {
            // A SET replaces what an earlier one selected, even when it
            // fails.
            self.session.select(&[]);
            if !self.session.structured {
                return self.error(
                    option,
                    rep::ERR_INVALID,
                    "OPT_SET_META_CONTEXT needs structured replies first",
                );
            }
        }
        let mut at = 0;
        let Some(name) = take_string(data, &mut at) else {
            return self.error(option, rep::ERR_INVALID, "inconsistent lengths in option");
        };
        if name.len() > MAX_STRING {
            return self.error(option, rep::ERR_INVALID, "export name too long");
        }
        let Some(count) = data.get(at..at + 4).map(|b| be32(b, 0)) else {
            return self.error(option, rep::ERR_INVALID, "inconsistent lengths in option");
        };
        at += 4;
        let offered = self.bitmaps.len();
        let mut selection = match (set, count) {
            (false, 0) => Selection::all(offered),
            _ => Selection::none(offered),
        };
        for _ in 0..count {
            let Some(query) = take_string(data, &mut at) else {
                return self.error(option, rep::ERR_INVALID, "inconsistent lengths in option");
            };
            selection.query(query, !set, self.bitmaps);
        }
        if at != data.len() {
            return self.error(option, rep::ERR_INVALID, "inconsistent lengths in option");
        }
        if name != self.export.name.as_bytes() {
            return self.error(option, rep::ERR_UNKNOWN, "export not present");
        }
        let contexts = selection.contexts();
        for c in &contexts {
            let id = if set { c.id() } else { 0 };
            let mut b = id.to_be_bytes().to_vec();
            b.extend_from_slice(c.name(self.bitmaps).as_bytes());
            self.reply(option, rep::META_CONTEXT, &b);
        }
        if set {
            self.session.select(&contexts);
        }
        self.reply(option, rep::ACK, &[]);
        Ok(Step::Next)
    }
}

#[cfg(test)]
mod tests;
