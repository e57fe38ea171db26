//! Starting and stopping one export: [`NbdServer::start`] checks the
//! configuration against the source, builds what every connection
//! shares (the export's description and transmission flags, its
//! bitmaps), binds the socket and starts the accept thread (in two steps
//! for an owner that wants the socket before the source:
//! [`NbdServer::bind`], then [`BoundExport::serve`]);
//! [`NbdServer::stop`] (or dropping the server) stops accepting, lets
//! every connection finish what it has in flight, joins the threads and
//! removes a Unix socket file.
//!
//! Multi-conn is advertised as qemu-storage-daemon (7.2) decides: when
//! the server takes more than one connection (`max_connections` other
//! than 1). It is safe for a source whose queues all work on one opened
//! image: a FLUSH on any connection writes the shared metadata caches
//! and syncs the files every queue writes through.

use std::sync::Arc;

use nbd::client::{NbdAddr, NbdUri};
use nbd::wire::consts::{flag, MAX_PAYLOAD, MAX_STRING, QEMU_DIRTY_BITMAP};
use thiserror::Error;

use crate::addr::ListenAddr;
use crate::listen::{Bound, Listener};
use crate::shared::ExportShared;
use crate::source::ExportSource;

/// One export: where, under which name, and what clients may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    pub addr: ListenAddr,
    /// The export name (at most 4096 bytes; empty: the default export).
    pub name: String,
    /// What `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION` show.
    pub description: Option<String>,
    /// Allow writes (the source must not be read-only).
    pub writable: bool,
    /// Most clients at once; 0 is no limit (qemu's `max-connections`).
    pub max_connections: u32,
}

/// Why an export could not start.
#[derive(Debug, Error)]
#[error("nbd export on {addr}: {reason}")]
pub struct ServerError {
    pub addr: String,
    pub reason: String,
}

/// A running export (see the module docs).
pub struct NbdServer {
    listener: Listener,
    name: String,
    describe: String,
}

/// An export whose socket is bound and listening but not served yet
/// ([`NbdServer::bind`]): clients that connect wait in the backlog until
/// [`BoundExport::serve`]. Dropped unserved, it removes a Unix socket
/// file.
pub struct BoundExport {
    config: ExportConfig,
    bound: Bound,
}

impl BoundExport {
    /// Where clients will connect (the bound port for `tcp:...:0`).
    pub fn addr(&self) -> &ListenAddr {
        self.bound.bound()
    }

    /// Checks the config against `source` and starts accepting clients.
    pub fn serve(self, source: Arc<dyn ExportSource>) -> Result<NbdServer, ServerError> {
        let BoundExport { config, bound } = self;
        let error = |reason: String| ServerError {
            addr: config.addr.to_string(),
            reason,
        };
        if config.writable && source.readonly() {
            return Err(error(
                "writable=on needs an image opened read-write (the image is read-only)".into(),
            ));
        }
        let bitmaps = source.bitmaps();
        let bitmap_names: Vec<String> = bitmaps.iter().map(|b| b.name.clone()).collect();
        if let Some(long) = bitmap_names
            .iter()
            .find(|n| QEMU_DIRTY_BITMAP.len() + n.len() > MAX_STRING)
        {
            return Err(error(format!(
                "the context name of bitmap '{long}' is longer than 4096 bytes"
            )));
        }
        let shared = Arc::new(ExportShared {
            desc: nbd::server::ExportDesc {
                name: config.name.clone(),
                description: config.description.clone(),
                size: source.size(),
                flags: transmission_flags(&config),
                block_sizes: [1, 4096, MAX_PAYLOAD],
            },
            source,
            writable: config.writable,
            bitmaps,
            bitmap_names,
        });
        let contexts: Vec<String> = std::iter::once("base:allocation".to_string())
            .chain(
                shared
                    .bitmap_names
                    .iter()
                    .map(|n| format!("{QEMU_DIRTY_BITMAP}{n}")),
            )
            .collect();
        let listener = bound.start(shared, config.max_connections).map_err(error)?;
        let shown = if config.name.is_empty() {
            "the default export".to_string()
        } else {
            format!("export '{}'", config.name)
        };
        let access = if config.writable {
            "writable"
        } else {
            "read-only"
        };
        let describe = match contexts.len() {
            1 => format!("nbd {shown} on {} ({access})", listener.bound()),
            _ => format!(
                "nbd {shown} on {} ({access}; contexts {})",
                listener.bound(),
                contexts.join(", ")
            ),
        };
        Ok(NbdServer {
            listener,
            name: config.name.clone(),
            describe,
        })
    }
}

impl NbdServer {
    /// Checks `config` against `source`, binds the socket and starts
    /// accepting clients.
    pub fn start(
        config: &ExportConfig,
        source: Arc<dyn ExportSource>,
    ) -> Result<NbdServer, ServerError> {
        Self::bind(config)?.serve(source)
    }

    /// Checks `config` and binds its socket, without serving anything
    /// yet: for an owner that must know the address can be used before
    /// it makes what it serves (the VMM's backup binds before the
    /// instant it freezes).
    pub fn bind(config: &ExportConfig) -> Result<BoundExport, ServerError> {
        let error = |reason: String| ServerError {
            addr: config.addr.to_string(),
            reason,
        };
        if config.name.len() > MAX_STRING {
            return Err(error("the export name is longer than 4096 bytes".into()));
        }
        if config
            .description
            .as_ref()
            .is_some_and(|d| d.len() > MAX_STRING)
        {
            return Err(error("the description is longer than 4096 bytes".into()));
        }
        let bound = Listener::bind(&config.addr).map_err(error)?;
        Ok(BoundExport {
            config: config.clone(),
            bound,
        })
    }

    /// Where clients connect (the bound port for `tcp:...:0`).
    pub fn addr(&self) -> &ListenAddr {
        self.listener.bound()
    }

    /// The export's URI in QEMU's and libnbd's spelling
    /// (`nbd+unix:///NAME?socket=PATH`, `nbd://HOST:PORT/NAME`).
    pub fn uri(&self) -> String {
        let addr = match self.addr() {
            ListenAddr::Unix(p) => NbdAddr::Unix(p.clone()),
            ListenAddr::Tcp { host, port } => NbdAddr::Tcp {
                host: host.clone(),
                port: *port,
            },
        };
        NbdUri {
            addr,
            export: self.name.clone(),
        }
        .to_string()
    }

    /// One line for a log: what is exported where.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Stops accepting, ends every connection once what it has in flight
    /// is answered, joins the threads and removes a Unix socket file.
    /// Dropping the server does the same.
    pub fn stop(mut self) {
        self.listener.stop();
    }
}

/// The export's transmission flags (`SEND_DF` is added per client).
fn transmission_flags(config: &ExportConfig) -> u16 {
    let mut flags = flag::HAS_FLAGS | flag::SEND_FLUSH | flag::SEND_FUA | flag::SEND_CACHE;
    if config.max_connections != 1 {
        flags |= flag::CAN_MULTI_CONN;
    }
    if config.writable {
        flags |= flag::SEND_TRIM | flag::SEND_WRITE_ZEROES | flag::SEND_FAST_ZERO;
    } else {
        flags |= flag::READ_ONLY;
    }
    flags
}
