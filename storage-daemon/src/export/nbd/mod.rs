//! The NBD export: the image over the NBD protocol on a Unix or TCP
//! socket, qemu-storage-daemon's `--export type=nbd` with its own server.
//!
//! The protocol is the `nbd` crate's (handshake, request parser, reply
//! encoders); this module drives it. [`start`] binds the socket and
//! starts the accept thread ([`listen`]); every client gets a thread of
//! its own ([`connection`]) with its own [`block::DiskQueue`], so several
//! clients run in parallel and nothing on the request path is shared
//! between them. A connection thread runs the handshake, then one loop:
//! read whatever the client sent, parse it into requests, turn them into
//! block requests ([`commands`]) and submit them as one batch, drain the
//! queue's completions into replies, send the replies with one `sendmsg`.
//! Nothing in that loop blocks on image I/O, so many requests are in
//! flight per connection.
//!
//! Multi-conn is advertised as qemu-storage-daemon (7.2) decides: when
//! the server takes more than one connection (`max_connections` other
//! than 1). It is safe here because every connection's queue works on
//! the same opened image: a FLUSH writes the shared metadata caches and
//! syncs the files every queue writes through.
//!
//! [`NbdExport::stop`] stops accepting, ends every connection's reading
//! (the kernel shuts the read side down), lets each finish the requests
//! it has in flight and send their replies, and joins the threads.

pub(super) mod commands;
mod connection;
mod listen;
mod poll;
mod shared;

use std::sync::Arc;

use block::Disk;
use ch_util::kv::{parse_on_off, KvError, KvList};
use nbd::wire::consts::{flag, MAX_PAYLOAD, MAX_STRING};

use super::running::{Export, ExportError};
pub use listen::ListenAddr;
use listen::Listener;
use shared::ExportShared;

/// `--export type=nbd,...`.
#[derive(Clone, Debug)]
pub struct NbdConfig {
    pub addr: ListenAddr,
    pub name: String,
    pub description: Option<String>,
    pub writable: bool,
    /// Most clients at once; 0 is no limit (qemu's `max-connections`).
    pub max_connections: u32,
}

impl NbdConfig {
    pub fn from_kv(kv: &mut KvList) -> Result<Self, KvError> {
        let option = kv.option();
        let addr = kv.take_required("addr")?;
        let bad = |key: &str, value: &str, reason: String| KvError::BadValue {
            option,
            key: key.into(),
            value: value.into(),
            reason,
        };
        let addr = ListenAddr::parse(&addr).map_err(|r| bad("addr", &addr, r))?;
        let name = kv.take("name")?.unwrap_or_default();
        if name.len() > MAX_STRING {
            return Err(bad("name", &name, "longer than 4096 bytes".into()));
        }
        let description = kv.take("description")?;
        if let Some(d) = &description {
            if d.len() > MAX_STRING {
                return Err(bad("description", d, "longer than 4096 bytes".into()));
            }
        }
        Ok(NbdConfig {
            addr,
            name,
            description,
            writable: kv.take_parsed("writable", parse_on_off)?.unwrap_or(false),
            max_connections: kv
                .take_parsed("max_connections", |s| {
                    s.parse::<u32>()
                        .map_err(|_| "expected a number (0: no limit)".to_string())
                })?
                .unwrap_or(0),
        })
    }
}

/// A running NBD export.
pub struct NbdExport {
    listener: Listener,
    describe: String,
}

fn nbd_error(config: &NbdConfig, reason: impl std::fmt::Display) -> ExportError {
    ExportError::Nbd {
        addr: config.addr.to_string(),
        reason: reason.to_string(),
    }
}

/// Binds the export's socket and starts accepting clients.
pub fn start(disk: &Disk, config: NbdConfig) -> Result<Box<dyn Export>, ExportError> {
    if config.writable && disk.readonly() {
        return Err(nbd_error(
            &config,
            "writable=on needs an image opened read-write (the image is read-only)",
        ));
    }
    let mut flags = flag::HAS_FLAGS | flag::SEND_FLUSH | flag::SEND_FUA | flag::SEND_CACHE;
    if config.max_connections != 1 {
        flags |= flag::CAN_MULTI_CONN;
    }
    if config.writable {
        flags |= flag::SEND_TRIM | flag::SEND_WRITE_ZEROES | flag::SEND_FAST_ZERO;
    } else {
        flags |= flag::READ_ONLY;
    }
    let info = disk.format().info();
    let shared = Arc::new(ExportShared {
        disk: disk.clone(),
        desc: nbd::server::ExportDesc {
            name: config.name.clone(),
            description: config.description.clone(),
            size: disk.size(),
            flags,
            block_sizes: [1, 4096, MAX_PAYLOAD],
        },
        writable: config.writable,
        cluster_size: info.cluster_size,
    });
    let listener = Listener::start(&config.addr, shared, config.max_connections)
        .map_err(|e| nbd_error(&config, e))?;
    let name = if config.name.is_empty() {
        "the default export".to_string()
    } else {
        format!("export '{}'", config.name)
    };
    Ok(Box::new(NbdExport {
        describe: format!(
            "nbd {name} on {} ({})",
            listener.addr(),
            if config.writable {
                "writable"
            } else {
                "read-only"
            }
        ),
        listener,
    }))
}

impl Export for NbdExport {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        self.listener.stop();
        Ok(())
    }
}
