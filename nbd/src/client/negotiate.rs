//! The client's handshake, blocking: fixed newstyle, then
//! OPT_STRUCTURED_REPLY, OPT_SET_META_CONTEXT (`base:allocation`) and
//! OPT_GO, falling back to OPT_EXPORT_NAME for servers without OPT_GO.
//! Block sizes are not requested, so the server may not hold us to a
//! minimum (it still may tell us its maximum, which we obey).
//!
//! A refusal from the server (an `NBD_REP_ERR_*` reply, such as an export
//! name it does not know) ends the handshake with `NBD_OPT_ABORT` (and
//! its ACK is read), so the server sees a client that said goodbye
//! rather than one that vanished.
//! Every I/O error names the step it met (a read that timed out under the
//! caller's socket timeouts is [`NegotiateError::TimedOut`]).

use std::io::{self, Read, Write};

use thiserror::Error;

use crate::wire::consts::{
    flag, handshake, info, opt, rep, BASE_ALLOCATION, IHAVEOPT, MAX_PAYLOAD, NBD_MAGIC,
    OLDSTYLE_MAGIC, REPLY_MAGIC,
};
use crate::wire::{be16, be32, be64, put_string, OptionHeader, OptionReplyHeader};

/// Longest option reply data we read.
const MAX_REPLY_LEN: u32 = 1 << 20;

/// What to negotiate.
#[derive(Clone, Debug, Default)]
pub struct ClientConfig {
    pub export: String,
    /// Ask for structured replies.
    pub structured: bool,
    /// Ask for `base:allocation` (needs `structured`).
    pub block_status: bool,
}

/// What the server said about the export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    /// Minimum, preferred and maximum block size, when the server said.
    pub block_sizes: Option<[u32; 3]>,
    pub structured: bool,
    /// The context id of `base:allocation`, when negotiated.
    pub base_allocation: Option<u32>,
}

impl ExportInfo {
    pub fn has(&self, f: u16) -> bool {
        self.flags & flag::HAS_FLAGS != 0 && self.flags & f != 0
    }

    pub fn read_only(&self) -> bool {
        self.has(flag::READ_ONLY)
    }

    /// Largest READ/WRITE payload to send: the server's maximum block
    /// size, at most 32 MiB.
    pub fn max_payload(&self) -> u32 {
        match self.block_sizes {
            Some([_, _, max]) if max > 0 => max.min(MAX_PAYLOAD),
            _ => MAX_PAYLOAD,
        }
    }
}

#[derive(Debug, Error)]
pub enum NegotiateError {
    #[error("I/O error while {step}")]
    Io {
        step: String,
        #[source]
        source: io::Error,
    },
    /// A read or write gave up under the socket's timeout.
    #[error("no answer in time while {0}")]
    TimedOut(String),
    #[error("the server closed the connection while we were {0}")]
    Closed(String),
    #[error("not an NBD server (magic {0:#x})")]
    NotNbd(u64),
    #[error("the server speaks the oldstyle handshake, which is not supported")]
    Oldstyle,
    #[error("the server has no export named '{name}'{message}")]
    UnknownExport { name: String, message: String },
    #[error("the server requires TLS, which is not supported")]
    TlsRequired,
    #[error("option {option} refused ({reply:#x}){message}")]
    Refused {
        option: u32,
        reply: u32,
        message: String,
    },
    #[error("malformed handshake reply: {0}")]
    Malformed(String),
}

fn malformed(s: impl Into<String>) -> NegotiateError {
    NegotiateError::Malformed(s.into())
}

impl NegotiateError {
    /// Whether the server refused what we asked (an error reply): the
    /// handshake can still be ended politely.
    fn is_refusal(&self) -> bool {
        matches!(
            self,
            NegotiateError::UnknownExport { .. }
                | NegotiateError::TlsRequired
                | NegotiateError::Refused { .. }
        )
    }
}

/// An I/O error met while `step` ("waiting for ...", "sending ..."):
/// a timeout and the end of the stream say so.
fn io_during(step: impl FnOnce() -> String) -> impl FnOnce(io::Error) -> NegotiateError {
    move |e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => NegotiateError::TimedOut(step()),
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset => NegotiateError::Closed(step()),
        _ => NegotiateError::Io {
            step: step(),
            source: e,
        },
    }
}

/// The protocol's name of an option, for messages.
fn option_name(option: u32) -> String {
    match option {
        opt::EXPORT_NAME => "NBD_OPT_EXPORT_NAME".into(),
        opt::ABORT => "NBD_OPT_ABORT".into(),
        opt::LIST => "NBD_OPT_LIST".into(),
        opt::GO => "NBD_OPT_GO".into(),
        opt::STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY".into(),
        opt::SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT".into(),
        o => format!("option {o}"),
    }
}

/// Sends `option` with `data`.
fn send_option<S: Write>(s: &mut S, option: u32, data: &[u8]) -> Result<(), NegotiateError> {
    let mut b = Vec::with_capacity(OptionHeader::SIZE + data.len());
    OptionHeader::new(option, data.len() as u32).encode(&mut b);
    b.extend_from_slice(data);
    s.write_all(&b)
        .and_then(|()| s.flush())
        .map_err(io_during(|| format!("sending {}", option_name(option))))
}

/// Reads one reply to `option`.
fn read_reply<S: Read>(s: &mut S, option: u32) -> Result<(u32, Vec<u8>), NegotiateError> {
    let waiting = || format!("waiting for the reply to {}", option_name(option));
    let mut h = [0u8; OptionReplyHeader::SIZE];
    s.read_exact(&mut h).map_err(io_during(waiting))?;
    let h = OptionReplyHeader::decode(&h);
    if h.magic != REPLY_MAGIC {
        return Err(malformed(format!("option reply magic {:#x}", h.magic)));
    }
    if h.option != option {
        return Err(malformed(format!(
            "reply to option {} while {option} was asked",
            h.option
        )));
    }
    if h.len > MAX_REPLY_LEN {
        return Err(malformed(format!("option reply of {} bytes", h.len)));
    }
    let mut data = vec![0u8; h.len as usize];
    s.read_exact(&mut data).map_err(io_during(waiting))?;
    Ok((h.reply, data))
}

fn message(data: &[u8]) -> String {
    if data.is_empty() {
        String::new()
    } else {
        format!(
            ": {}",
            String::from_utf8_lossy(&data[..data.len().min(200)])
        )
    }
}

fn refused(option: u32, reply: u32, data: &[u8], export: &str) -> NegotiateError {
    match reply {
        rep::ERR_UNKNOWN => NegotiateError::UnknownExport {
            name: export.to_string(),
            message: message(data),
        },
        rep::ERR_TLS_REQD => NegotiateError::TlsRequired,
        _ => NegotiateError::Refused {
            option,
            reply,
            message: message(data),
        },
    }
}

/// Reads the server's greeting and answers it; returns whether the
/// server is fixed newstyle and whether NO_ZEROES was agreed.
fn greet<S: Read + Write>(s: &mut S) -> Result<(bool, bool), NegotiateError> {
    let greeting = || "waiting for the server's greeting".to_string();
    let mut b = [0u8; 16];
    s.read_exact(&mut b).map_err(io_during(greeting))?;
    if be64(&b, 0) != NBD_MAGIC {
        return Err(NegotiateError::NotNbd(be64(&b, 0)));
    }
    match be64(&b, 8) {
        IHAVEOPT => {}
        OLDSTYLE_MAGIC => return Err(NegotiateError::Oldstyle),
        m => return Err(malformed(format!("second magic {m:#x}"))),
    }
    let mut f = [0u8; 2];
    s.read_exact(&mut f).map_err(io_during(greeting))?;
    let flags = be16(&f, 0);
    let fixed = flags & handshake::FIXED_NEWSTYLE != 0;
    let no_zeroes = flags & handshake::NO_ZEROES != 0;
    let mut client = 0u32;
    if fixed {
        client |= u32::from(handshake::FIXED_NEWSTYLE);
    }
    if no_zeroes {
        client |= u32::from(handshake::NO_ZEROES);
    }
    s.write_all(&client.to_be_bytes())
        .map_err(io_during(|| "sending the client flags".to_string()))?;
    Ok((fixed, no_zeroes))
}

/// Runs the handshake for `cfg.export`; a refusal is answered with
/// `NBD_OPT_ABORT` before the error returns.
pub fn negotiate<S: Read + Write>(
    s: &mut S,
    cfg: &ClientConfig,
) -> Result<ExportInfo, NegotiateError> {
    let (fixed, no_zeroes) = greet(s)?;
    if !fixed {
        return export_name(s, cfg, no_zeroes, ExportInfo::default());
    }
    negotiate_options(s, cfg, no_zeroes).inspect_err(|e| {
        if e.is_refusal() {
            // The server waits for the next option: say goodbye, and
            // take its ACK (or its hang-up) so it does not write to a
            // closed socket.
            if send_option(s, opt::ABORT, &[]).is_ok() {
                let _ = read_reply(s, opt::ABORT);
            }
        }
    })
}

/// The options of fixed newstyle, after the greeting.
fn negotiate_options<S: Read + Write>(
    s: &mut S,
    cfg: &ClientConfig,
    no_zeroes: bool,
) -> Result<ExportInfo, NegotiateError> {
    let mut info = ExportInfo::default();
    if cfg.structured {
        send_option(s, opt::STRUCTURED_REPLY, &[])?;
        let (reply, _) = read_reply(s, opt::STRUCTURED_REPLY)?;
        info.structured = reply == rep::ACK;
    }
    if info.structured && cfg.block_status {
        let mut d = Vec::new();
        put_string(&mut d, cfg.export.as_bytes());
        d.extend_from_slice(&1u32.to_be_bytes());
        put_string(&mut d, BASE_ALLOCATION.as_bytes());
        send_option(s, opt::SET_META_CONTEXT, &d)?;
        loop {
            let (reply, data) = read_reply(s, opt::SET_META_CONTEXT)?;
            match reply {
                rep::META_CONTEXT if data.len() >= 4 => {
                    if &data[4..] == BASE_ALLOCATION.as_bytes() {
                        info.base_allocation = Some(be32(&data, 0));
                    }
                }
                rep::META_CONTEXT => return Err(malformed("short META_CONTEXT reply")),
                rep::ACK => break,
                // A refusal only means no block status.
                r if r & rep::ERR_BIT != 0 => break,
                r => return Err(malformed(format!("reply type {r} to SET_META_CONTEXT"))),
            }
        }
    }
    let mut d = Vec::new();
    put_string(&mut d, cfg.export.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    send_option(s, opt::GO, &d)?;
    let mut have_export = false;
    loop {
        let (reply, data) = read_reply(s, opt::GO)?;
        match reply {
            rep::INFO if data.len() >= 2 => match be16(&data, 0) {
                info::EXPORT if data.len() == 12 => {
                    info.size = be64(&data, 2);
                    info.flags = be16(&data, 10);
                    have_export = true;
                }
                info::BLOCK_SIZE if data.len() == 14 => {
                    info.block_sizes = Some([be32(&data, 2), be32(&data, 6), be32(&data, 10)]);
                }
                info::EXPORT | info::BLOCK_SIZE => {
                    return Err(malformed("NBD_REP_INFO of the wrong length"))
                }
                _ => {}
            },
            rep::INFO => return Err(malformed("short NBD_REP_INFO")),
            rep::ACK if have_export => return Ok(info),
            rep::ACK => return Err(malformed("OPT_GO acknowledged without NBD_INFO_EXPORT")),
            rep::ERR_UNSUP => return export_name(s, cfg, no_zeroes, info),
            r if r & rep::ERR_BIT != 0 => return Err(refused(opt::GO, r, &data, &cfg.export)),
            r => return Err(malformed(format!("reply type {r} to OPT_GO"))),
        }
    }
}

/// The old way in: OPT_EXPORT_NAME, answered with size and flags only.
fn export_name<S: Read + Write>(
    s: &mut S,
    cfg: &ClientConfig,
    no_zeroes: bool,
    mut info: ExportInfo,
) -> Result<ExportInfo, NegotiateError> {
    send_option(s, opt::EXPORT_NAME, cfg.export.as_bytes())?;
    let mut b = vec![0u8; if no_zeroes { 10 } else { 134 }];
    s.read_exact(&mut b).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => NegotiateError::UnknownExport {
            name: cfg.export.clone(),
            message: " (the server closed the connection)".into(),
        },
        _ => io_during(|| "waiting for the reply to NBD_OPT_EXPORT_NAME".to_string())(e),
    })?;
    info.size = be64(&b, 0);
    info.flags = be16(&b, 8);
    Ok(info)
}

/// OPT_LIST: the exports a server offers, with their descriptions. Ends
/// with OPT_ABORT.
pub fn list_exports<S: Read + Write>(s: &mut S) -> Result<Vec<(String, String)>, NegotiateError> {
    let (fixed, _) = greet(s)?;
    if !fixed {
        return Err(malformed("listing needs fixed newstyle"));
    }
    send_option(s, opt::LIST, &[])?;
    let mut out = Vec::new();
    loop {
        let (reply, data) = read_reply(s, opt::LIST)?;
        match reply {
            rep::SERVER if data.len() >= 4 => {
                let n = be32(&data, 0) as usize;
                let name = data
                    .get(4..4 + n)
                    .ok_or_else(|| malformed("export name past the reply"))?;
                out.push((
                    String::from_utf8_lossy(name).into_owned(),
                    String::from_utf8_lossy(&data[4 + n..]).into_owned(),
                ));
            }
            rep::ACK => break,
            r if r & rep::ERR_BIT != 0 => return Err(refused(opt::LIST, r, &data, "")),
            r => return Err(malformed(format!("reply type {r} to OPT_LIST"))),
        }
    }
    send_option(s, opt::ABORT, &[])?;
    Ok(out)
}
