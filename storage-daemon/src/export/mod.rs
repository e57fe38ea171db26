//! The exports: each turns the image the daemon owns ([`ExclusiveImage`])
//! into something another program uses (a file over FUSE, a
//! vhost-user-blk socket, an NBD server) through queues of its
//! [`block::Disk`].
//!
//! An export's configuration comes from its own `--export` keys
//! ([`ExportConfig::from_kv`]); [`start`] opens its queues on the disk and
//! starts its threads; [`Export::stop`] (on SIGTERM or SIGINT) makes it
//! stop taking requests, waits for every request in flight and joins its
//! threads, so the daemon can then close the image clean.

pub mod fuse;
pub mod nbd;
pub mod vhost_user_blk;

use block::options::kv::{KvError, KvList};
use block::ExclusiveImage;
use thiserror::Error;

/// One `--export`.
#[derive(Debug)]
pub enum ExportConfig {
    Fuse(fuse::FuseConfig),
    VhostUserBlk(vhost_user_blk::VhostUserBlkConfig),
    Nbd(nbd::NbdConfig),
}

impl ExportConfig {
    /// Takes `type=` and that type's keys; the caller refuses the rest.
    pub fn from_kv(kv: &mut KvList) -> Result<Self, KvError> {
        let option = kv.option();
        let kind = kv.take_required("type")?;
        match kind.as_str() {
            "fuse" => Ok(ExportConfig::Fuse(fuse::FuseConfig::from_kv(kv)?)),
            "vhost-user-blk" => Ok(ExportConfig::VhostUserBlk(
                vhost_user_blk::VhostUserBlkConfig::from_kv(kv)?,
            )),
            "nbd" => Ok(ExportConfig::Nbd(nbd::NbdConfig::from_kv(kv)?)),
            _ => Err(KvError::BadValue {
                option,
                key: "type".into(),
                value: kind,
                reason: "expected fuse, vhost-user-blk or nbd".into(),
            }),
        }
    }
}

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

/// Starts the export `config` of `image`, which the daemon owns: the
/// vhost-user export gets its disk (queues only), FUSE also a
/// [`block::Resizer`] for `truncate` and growable writes.
pub fn start(image: &ExclusiveImage, config: ExportConfig) -> Result<Box<dyn Export>, ExportError> {
    match config {
        ExportConfig::Fuse(c) => fuse::start(image, c),
        ExportConfig::VhostUserBlk(c) => vhost_user_blk::start(image.disk(), c),
        ExportConfig::Nbd(c) => nbd::start(image.disk(), c),
    }
}
