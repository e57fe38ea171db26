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

#[cfg(test)]
mod error_answers;
pub mod fuse;
pub mod nbd;
mod running;
pub mod vhost_user_blk;

use block::ExclusiveImage;
use ch_util::kv::{KvError, KvList};

pub use running::{Export, ExportError};

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

/// Starts the export `config` of `image`, which the daemon owns: the
/// vhost-user export gets its disk (queues only), FUSE also a
/// [`block::Resizer`] for `truncate` and growable writes, NBD the image
/// to read a persistent bitmap from when one is exported.
pub fn start(image: &ExclusiveImage, config: ExportConfig) -> Result<Box<dyn Export>, ExportError> {
    match config {
        ExportConfig::Fuse(c) => fuse::start(image, c),
        ExportConfig::VhostUserBlk(c) => vhost_user_blk::start(image.disk(), c),
        ExportConfig::Nbd(c) => nbd::start(image, c),
    }
}
