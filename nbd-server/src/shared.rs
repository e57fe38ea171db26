//! What every connection of one export shares: its source, its
//! description and flags, and the bitmaps it offers, made once by
//! `crate::server` and handed to the accept thread (`crate::listen`),
//! which gives each connection (`crate::connection`, `crate::commands`)
//! its reference.

use std::sync::Arc;

use crate::bitmap::ExportedBitmap;
use crate::source::ExportSource;

/// What every connection of one export shares (read-only).
pub struct ExportShared {
    pub source: Arc<dyn ExportSource>,
    pub desc: nbd::server::ExportDesc,
    pub writable: bool,
    /// The `qemu:dirty-bitmap:NAME` contexts, in the order the handshake
    /// numbers them.
    pub bitmaps: Vec<ExportedBitmap>,
    /// Their names, as the handshake takes them.
    pub bitmap_names: Vec<String>,
}
