//! [`BitmapSink`]: where a disk's persistent dirty bitmaps go when it
//! closes: the image's tools (the owner's open) and its cluster size.
//! `persist::attach` makes one; `LiveState::store_persistent` uses it.

use std::sync::Arc;

use super::bitmaps::NamedBitmap;
use crate::error::BlockError;
use crate::formats::dirty_bits::PersistedBitmap;
use crate::formats::tools::ImageTools;

/// Stores a disk's persistent bitmaps in its image (made by
/// [`attach`](super::attach)).
pub struct BitmapSink {
    tools: Arc<dyn ImageTools>,
    /// The image's cluster size: the chunk of the bits it stores.
    cluster_size: u64,
}

impl std::fmt::Debug for BitmapSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BitmapSink")
            .field("cluster_size", &self.cluster_size)
            .finish()
    }
}

impl BitmapSink {
    pub(super) fn new(tools: Arc<dyn ImageTools>, cluster_size: u64) -> Self {
        BitmapSink {
            tools,
            cluster_size,
        }
    }

    /// Writes `bitmaps` (the persistent ones of the registry) as the
    /// image's bitmaps, consistent ones with their bits and not in use
    /// (the disk is closing).
    pub(super) fn store(&self, bitmaps: &[NamedBitmap]) -> Result<(), BlockError> {
        self.write(bitmaps, true)
    }

    /// Writes every persistent bitmap of `bitmaps` still in use, with
    /// tables that fit the disk's size now (it was resized, or the
    /// bitmaps came from another image: a crash before the close must
    /// leave tables an open accepts). The bits are written too, though an
    /// in-use bitmap's bits are never read.
    pub(super) fn store_in_use(&self, bitmaps: &[NamedBitmap]) -> Result<(), BlockError> {
        self.write(bitmaps, false)
    }

    /// `closing`: consistent bitmaps are stored clean with their bits,
    /// inconsistent ones keep their stored tables; otherwise every one is
    /// stored in use with its bits.
    fn write(&self, bitmaps: &[NamedBitmap], closing: bool) -> Result<(), BlockError> {
        let list: Vec<PersistedBitmap> = bitmaps
            .iter()
            .filter(|b| b.persistent)
            .map(|b| PersistedBitmap {
                name: b.name.clone(),
                granularity: b.bitmap.granularity(),
                recording: b.enabled,
                in_use: !closing || b.inconsistent,
                bits: (!closing || !b.inconsistent).then(|| b.bitmap.to_bits(self.cluster_size)),
            })
            .collect();
        self.tools.store_bitmaps(&list)
    }
}
