//! Persistent dirty bitmaps of a running qcow2 disk, kept as QEMU keeps
//! them: loaded into the disk's live bitmaps when the owner opens the
//! image read-write, marked in use in the image before any guest write
//! (so a crash leaves them inconsistent, and QEMU and `ch-img` refuse
//! them), and stored back with the in-use flag cleared when the disk
//! closes cleanly.
//!
//! [`attach`] enters with the image's tools (the owner's open) and the
//! disk's [`LiveState`]; it leaves the bitmaps in the registry and a
//! [`BitmapSink`] in the state, which [`LiveState::store_persistent`]
//! (called by `Disk::close`) uses once. Bitmaps found in use at open are
//! kept, inconsistent: they can only be removed (QEMU's rule); a clean
//! close writes them back still in use, unless they were removed.

use std::sync::Arc;

use super::bitmaps::NamedBitmap;
use super::dirty_bitmap::DirtyBitmap;
use super::LiveState;
use crate::error::BlockError;
use crate::formats::dirty_bits::PersistedBitmap;
use crate::formats::tools::ImageTools;

/// Stores a disk's persistent bitmaps in its image (made by [`attach`]).
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
    /// Writes `bitmaps` (the persistent ones of the registry) as the
    /// image's bitmaps, consistent ones with their bits and not in use.
    fn store(&self, bitmaps: &[NamedBitmap]) -> Result<(), BlockError> {
        let list: Vec<PersistedBitmap> = bitmaps
            .iter()
            .filter(|b| b.persistent)
            .map(|b| PersistedBitmap {
                name: b.name.clone(),
                granularity: b.bitmap.granularity(),
                recording: b.enabled,
                in_use: b.inconsistent,
                bits: (!b.inconsistent).then(|| b.bitmap.to_bits(self.cluster_size)),
            })
            .collect();
        self.tools.store_bitmaps(&list)
    }
}

/// Loads the image's persistent bitmaps into `live` and marks them in
/// use in the image (see the module docs). A qcow2 image of version 2
/// gets in-memory bitmaps only. Fails, with the image unchanged, when
/// the bitmaps cannot be read or marked.
pub fn attach(tools: Arc<dyn ImageTools>, live: &LiveState) -> Result<(), BlockError> {
    let info = tools.info();
    let size = tools.size();
    if tools.name() != "qcow2" {
        return Ok(());
    }
    if info.compat.as_deref() == Some("0.10") {
        live.bitmaps().configure(
            size,
            Some("qcow2 version 2 images cannot store dirty bitmaps".into()),
        );
        return Ok(());
    }
    let cluster_size = info.cluster_size.unwrap_or(65536);
    let loaded = tools.load_bitmaps()?;
    let mut named = Vec::with_capacity(loaded.len());
    for b in &loaded {
        let bitmap = match &b.bits {
            Some(bits) => DirtyBitmap::from_bits(bits),
            None => DirtyBitmap::new(b.granularity, size),
        }
        .map_err(|why| BlockError::Refused(format!("bitmap '{}': {why}", b.name)))?;
        if named.iter().any(|n: &NamedBitmap| n.name == b.name) {
            return Err(BlockError::Refused(format!(
                "bitmap '{}' is in the image twice",
                b.name
            )));
        }
        named.push(NamedBitmap {
            name: b.name.clone(),
            bitmap: Arc::new(bitmap),
            enabled: b.recording,
            persistent: true,
            inconsistent: b.in_use,
        });
    }
    if !loaded.is_empty() {
        let marked: Vec<PersistedBitmap> = loaded
            .into_iter()
            .map(|b| PersistedBitmap {
                in_use: true,
                bits: None,
                ..b
            })
            .collect();
        tools.store_bitmaps(&marked)?;
    }
    let mut registry = live.bitmaps();
    registry.configure(size, None);
    for b in named {
        // Names were checked unique above and the registry was empty.
        let _ = registry.insert(b);
    }
    drop(registry);
    live.set_sink(BitmapSink {
        tools,
        cluster_size,
    });
    Ok(())
}

impl LiveState {
    fn set_sink(&self, sink: BitmapSink) {
        *super::lock(&self.sink) = Some(sink);
    }

    /// Stores the persistent bitmaps in the image they were loaded from
    /// (once: the disk is closing; later calls do nothing). The queues
    /// must be stopped.
    pub fn store_persistent(&self) -> Result<(), BlockError> {
        let Some(sink) = super::lock(&self.sink).take() else {
            return Ok(());
        };
        let bitmaps = self.bitmaps().list().to_vec();
        sink.store(&bitmaps)
    }
}
