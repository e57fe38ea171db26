//! What every connection of one export shares: the disk, the export's
//! description and flags, made once by [`super::start`] and handed to the
//! accept thread ([`super::listen`]), which gives each connection
//! ([`super::connection`], [`super::commands`]) its reference.

use block::Disk;

/// What every connection of one export shares (read-only).
pub struct ExportShared {
    pub disk: Disk,
    pub desc: nbd::server::ExportDesc,
    pub writable: bool,
    /// qcow2's cluster size (FAST_ZERO on whole clusters is metadata only).
    pub cluster_size: Option<u64>,
}
