//! What every export is once started: the [`Export`] trait the daemon
//! stops it through, and [`ExportError`], why one could not start or stop.
//! Each export implements and returns these; they sit below the exports
//! so the module that picks an export ([`super::start`]) is the only one
//! above them.

use thiserror::Error;

/// A running export.
pub trait Export {
    /// One line for the log: what is exported where.
    fn describe(&self) -> String;
    /// Stops taking requests, completes every request in flight and joins
    /// the export's threads.
    fn stop(self: Box<Self>) -> Result<(), ExportError>;
}

/// Why an export could not start or stop cleanly.
#[derive(Debug, Error)]
pub enum ExportError {
    #[error("fuse export on {mountpoint}: {reason}")]
    Fuse { mountpoint: String, reason: String },
    #[error("vhost-user-blk export on {socket}: {reason}")]
    VhostUserBlk { socket: String, reason: String },
    #[error("nbd export on {addr}: {reason}")]
    Nbd { addr: String, reason: String },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Block(#[from] block::BlockError),
}
