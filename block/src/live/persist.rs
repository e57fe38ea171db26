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
use super::sink::BitmapSink;
use super::state::LiveState;
use crate::error::BlockError;
use crate::formats::dirty_bits::PersistedBitmap;
use crate::formats::tools::ImageTools;

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
    live.set_sink(BitmapSink::new(tools, cluster_size));
    Ok(())
}

/// Makes `live` store its persistent bitmaps in `tools`' image without
/// loading the ones the image lists: the image is a running image
/// reopened over a new chain (a stream or a commit), whose bitmaps are
/// the ones the old open holds in memory, marked in use in the file, and
/// moves here at the switch (`LiveState::take_bitmaps_from`, which
/// writes them at once, still in use). The old open must not store them
/// any more ([`LiveState::forget_sink`]).
pub fn adopt(tools: Arc<dyn ImageTools>, live: &LiveState) {
    let info = tools.info();
    if tools.name() != "qcow2" {
        return;
    }
    let size = tools.size();
    if info.compat.as_deref() == Some("0.10") {
        live.bitmaps().configure(
            size,
            Some("qcow2 version 2 images cannot store dirty bitmaps".into()),
        );
        return;
    }
    let cluster_size = info.cluster_size.unwrap_or(65536);
    live.bitmaps().configure(size, None);
    live.set_sink(BitmapSink::new(tools, cluster_size));
}
