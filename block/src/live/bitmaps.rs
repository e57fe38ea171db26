//! The named dirty bitmaps of a running disk, as its owner manages them:
//! add, remove, clear, enable, disable, merge (QEMU's
//! `block-dirty-bitmap-*`), refused where QEMU refuses, and the deep
//! copy a transaction restores when one of its actions fails.
//!
//! Requests enter as methods of [`BitmapRegistry`] (reached through
//! [`super::LiveState::bitmaps`], which publishes the enabled bitmaps to
//! the queues afterwards); facts leave as [`BitmapInfo`]. A bitmap found
//! in use in an image at open (the image was not closed cleanly while it
//! recorded) is kept but `inconsistent`: it can only be removed.

use std::sync::Arc;

use thiserror::Error;

use super::dirty_bitmap::{check_granularity, DirtyBitmap};

/// The longest name (qcow2 stores at most 1023 bytes).
pub const MAX_NAME: usize = 1023;
/// The most bytes of bits a qcow2 image stores for one bitmap.
const MAX_STORED_BYTES: u64 = 512 << 20;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LiveError {
    #[error("no dirty bitmap named '{0}'")]
    NotFound(String),
    #[error("a dirty bitmap named '{0}' exists already")]
    Exists(String),
    #[error("{0}")]
    BadGranularity(String),
    #[error("a bitmap name must be 1 to {MAX_NAME} bytes")]
    BadName,
    #[error(
        "dirty bitmap '{0}' is inconsistent (its image was not closed cleanly while it \
         recorded) and cannot be used; it can only be removed"
    )]
    Inconsistent(String),
    #[error("dirty bitmap '{name}' cannot be persistent: {why}")]
    NotPersistable { name: String, why: String },
}

/// One named bitmap of a disk.
#[derive(Clone, Debug)]
pub struct NamedBitmap {
    pub name: String,
    pub bitmap: Arc<DirtyBitmap>,
    /// It records writes.
    pub enabled: bool,
    /// It is stored in the image at close (qcow2 only).
    pub persistent: bool,
    /// It was found in use at open: it may only be removed.
    pub inconsistent: bool,
}

/// What `vm.disk-info` shows of a bitmap (QEMU's `query-block` names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapInfo {
    pub name: String,
    pub granularity: u64,
    /// Bytes in dirty granules.
    pub count: u64,
    pub recording: bool,
    pub persistent: bool,
    pub inconsistent: bool,
}

impl BitmapInfo {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "granularity": self.granularity,
            "count": self.count,
            "recording": self.recording,
            "persistent": self.persistent,
            "inconsistent": self.inconsistent,
        })
    }
}

/// The bitmaps as they were, for [`BitmapRegistry::restore`].
#[derive(Debug)]
pub struct Checkpoint(Vec<NamedBitmap>);

/// See the module docs.
#[derive(Debug, Default)]
pub struct BitmapRegistry {
    list: Vec<NamedBitmap>,
    /// Bitmaps of block jobs (a mirror's): they record like enabled
    /// ones but have no name, are never listed, stored or moved, and
    /// keep their size (a job's disk is not resized).
    internal: Vec<Arc<DirtyBitmap>>,
    /// Bytes of the disk (every bitmap covers them).
    disk_size: u64,
    /// Why bitmaps of this disk cannot be persistent (`None`: they can).
    no_persistence: Option<String>,
}

impl BitmapRegistry {
    /// Sets what every later bitmap covers and whether it may persist;
    /// the owner calls this once when it opens the disk.
    pub fn configure(&mut self, disk_size: u64, no_persistence: Option<String>) {
        self.disk_size = disk_size;
        self.no_persistence = no_persistence;
    }

    pub fn list(&self) -> &[NamedBitmap] {
        &self.list
    }

    pub fn find(&self, name: &str) -> Option<&NamedBitmap> {
        self.list.iter().find(|b| b.name == name)
    }

    fn index(&self, name: &str) -> Result<usize, LiveError> {
        self.list
            .iter()
            .position(|b| b.name == name)
            .ok_or_else(|| LiveError::NotFound(name.to_string()))
    }

    /// The bitmap `name`, refused if inconsistent.
    fn usable(&self, name: &str) -> Result<usize, LiveError> {
        let i = self.index(name)?;
        if self.list[i].inconsistent {
            return Err(LiveError::Inconsistent(name.to_string()));
        }
        Ok(i)
    }

    /// Adds a clean bitmap; `disabled` ones do not record until enabled.
    pub fn add(
        &mut self,
        name: &str,
        granularity: u64,
        persistent: bool,
        disabled: bool,
    ) -> Result<(), LiveError> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(LiveError::BadName);
        }
        check_granularity(granularity).map_err(LiveError::BadGranularity)?;
        if self.find(name).is_some() {
            return Err(LiveError::Exists(name.to_string()));
        }
        if persistent {
            let why = match &self.no_persistence {
                Some(why) => Some(why.clone()),
                // qcow2 stores at most 512 MiB of bits per bitmap.
                None if self.disk_size.div_ceil(granularity).div_ceil(8) > MAX_STORED_BYTES => {
                    Some(
                        "its bits would take too much space in the image; use a larger granularity"
                            .into(),
                    )
                }
                None => None,
            };
            if let Some(why) = why {
                return Err(LiveError::NotPersistable {
                    name: name.to_string(),
                    why,
                });
            }
        }
        let bitmap = DirtyBitmap::new(granularity, self.disk_size).map_err(|why| {
            LiveError::NotPersistable {
                name: name.to_string(),
                why,
            }
        })?;
        self.insert(NamedBitmap {
            name: name.to_string(),
            bitmap: Arc::new(bitmap),
            enabled: !disabled,
            persistent,
            inconsistent: false,
        })
    }

    /// Adds a bitmap as it was loaded (from an image at open).
    pub fn insert(&mut self, bitmap: NamedBitmap) -> Result<(), LiveError> {
        if self.find(&bitmap.name).is_some() {
            return Err(LiveError::Exists(bitmap.name));
        }
        self.list.push(bitmap);
        Ok(())
    }

    /// Removes `name` (inconsistent ones too) and returns it.
    pub fn remove(&mut self, name: &str) -> Result<NamedBitmap, LiveError> {
        let i = self.index(name)?;
        Ok(self.list.remove(i))
    }

    pub fn clear(&mut self, name: &str) -> Result<(), LiveError> {
        let i = self.usable(name)?;
        self.list[i].bitmap.clear();
        Ok(())
    }

    pub fn enable(&mut self, name: &str) -> Result<(), LiveError> {
        let i = self.usable(name)?;
        self.list[i].enabled = true;
        Ok(())
    }

    pub fn disable(&mut self, name: &str) -> Result<(), LiveError> {
        let i = self.usable(name)?;
        self.list[i].enabled = false;
        Ok(())
    }

    /// Sets in `name` every granule any of `sources` has dirty.
    pub fn merge(&mut self, name: &str, sources: &[String]) -> Result<(), LiveError> {
        let target = self.usable(name)?;
        let sources: Vec<usize> = sources
            .iter()
            .map(|s| self.usable(s))
            .collect::<Result<_, _>>()?;
        for s in sources {
            if s != target {
                self.list[target].bitmap.merge_from(&self.list[s].bitmap);
            }
        }
        Ok(())
    }

    /// The bitmaps that record writes (the queues' filter set).
    pub fn recording(&self) -> Vec<Arc<DirtyBitmap>> {
        self.list
            .iter()
            .filter(|b| b.enabled && !b.inconsistent)
            .map(|b| b.bitmap.clone())
            .chain(self.internal.iter().cloned())
            .collect()
    }

    /// A block job's bitmap records from now on (see `internal`).
    pub fn attach_internal(&mut self, bitmap: Arc<DirtyBitmap>) {
        self.internal.push(bitmap);
    }

    /// A block job's bitmap stops recording.
    pub fn detach_internal(&mut self, bitmap: &Arc<DirtyBitmap>) {
        self.internal.retain(|b| !Arc::ptr_eq(b, bitmap));
    }

    pub fn infos(&self) -> Vec<BitmapInfo> {
        self.list
            .iter()
            .map(|b| BitmapInfo {
                name: b.name.clone(),
                granularity: b.bitmap.granularity(),
                count: b.bitmap.dirty_bytes(),
                recording: b.enabled && !b.inconsistent,
                persistent: b.persistent,
                inconsistent: b.inconsistent,
            })
            .collect()
    }

    /// A deep copy of every bitmap and its flags.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint(
            self.list
                .iter()
                .map(|b| NamedBitmap {
                    bitmap: Arc::new(b.bitmap.frozen()),
                    ..b.clone()
                })
                .collect(),
        )
    }

    /// Puts back the bitmaps of a checkpoint.
    pub fn restore(&mut self, checkpoint: Checkpoint) {
        self.list = checkpoint.0;
    }

    /// The disk now has `size` bytes: every bitmap follows (see
    /// [`DirtyBitmap::resized`]).
    pub fn resize(&mut self, size: u64) {
        self.disk_size = size;
        for b in &mut self.list {
            b.bitmap = Arc::new(b.bitmap.resized(size));
        }
    }

    /// Takes every bitmap out (the disk is closing, or its bitmaps move
    /// to the image it is switched to).
    pub fn take_all(&mut self) -> Vec<NamedBitmap> {
        std::mem::take(&mut self.list)
    }

    /// Why bitmaps here cannot be stored in the image (`None`: they can).
    pub fn no_persistence(&self) -> Option<&str> {
        self.no_persistence.as_deref()
    }
}
