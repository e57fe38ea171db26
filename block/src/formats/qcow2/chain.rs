//! [`Chain`]: what an open qcow2 image is made of and never changes
//! after open: its path, its files (its own, its external data file, then
//! its backing chain's), the backing image, and the header it was opened
//! with.
//!
//! The opener builds it; the image keeps it beside its locked `State`.
//! The planners and tool operations borrow it (with the tables they need)
//! to turn L2 entries into host extents of the right file, to read
//! copy-on-write sources and to plan ranges the backing image decides.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use super::backing::Backing;
use crate::error::BlockError;
use crate::formats::qcow2::on_disk::header::Header;
use crate::formats::{FileId, ImageFiles};

/// See the module docs.
pub(crate) struct Chain {
    pub path: PathBuf,
    /// This image, its data file (if any), then the backing chain's
    /// local files; its remote files (an NBD backing file) after them.
    pub files: ImageFiles,
    /// Buffered descriptors in the same order (metadata and COW reads).
    pub cow_files: Vec<Arc<File>>,
    pub backing: Option<Backing>,
    /// FileId of the backing image's first file.
    pub backing_base: u16,
    /// Where guest data lives: FileId(0), or the external data file.
    pub data_file: FileId,
    /// Guest data goes through the page cache (no O_DIRECT): a new
    /// cluster past the file's old end then gets only the blocks its
    /// data touches (`planning::write`).
    pub buffered_data: bool,
    /// The header as the image was opened (the open itself may have
    /// changed bits on disk since; see `header_cluster::current_header`).
    pub header: Header,
}

impl Chain {
    pub fn cluster_size(&self) -> u64 {
        self.header.cluster_size()
    }

    /// Images below this one.
    pub fn backing_layers(&self) -> u32 {
        self.backing.as_ref().map_or(0, |b| b.layers)
    }

    /// Whether the backing image shows through at guest offset `guest`
    /// (there is one, and `guest` is inside its disk).
    pub fn backing_covers(&self, guest: u64) -> bool {
        self.backing
            .as_ref()
            .is_some_and(|b| guest < b.image.size())
    }

    pub fn invalid(&self, reason: impl Into<String>) -> BlockError {
        BlockError::InvalidImage {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }
}
