//! The owner's open of an image: queue-facing I/O plus the tool
//! capabilities a queue handle can never reach.
//!
//! [`ExclusiveImage::open`] opens the image (taking its locks as
//! [`crate::Disk::open`] does) and keeps two views of the same opened
//! format: a [`Disk`] for I/O (the blocking helpers, and queues the owner
//! creates), and the [`ImageTools`] object with snapshots, backing edits,
//! compressed writes, make-empty and resize ([`crate::formats::tools`]).
//! A `Disk` or [`crate::DiskQueue`] holds only the queue-facing
//! [`crate::formats::Format`]; cloning the disk or making queues never
//! passes the tools on. A tool that needs both (convert writes compressed
//! and plain clusters, commit copies data then empties the top) asks the
//! owner for each.
//!
//! The owner decides when a tool capability may run beside requests in
//! flight: snapshots, backing edits and make-empty only when none is (ch-img
//! runs one request at a time on its own queue); compressed writes take the
//! format's metadata lock like a queue's plan, so convert keeps its own
//! plain writes of other clusters in flight beside them (its write-behind
//! queue, ch-img/src/write_behind.rs). The one
//! capability an owner may lend to threads that run queues is resizing,
//! through a [`Resizer`] (the storage daemon hands one to its FUSE export
//! for `truncate` and growable writes).
//!
//! ```no_run
//! # fn main() -> Result<(), block::BlockError> {
//! let image = block::ExclusiveImage::open(&block::DiskOptions::new("img.qcow2"))?;
//! image.disk().write_at(0, &[0; 512])?;
//! image.tools().snapshot_create("before", (0, 0))?;
//! image.close()
//! # }
//! ```
//!
//! A queue handle has no way to the tools; this does not compile:
//!
//! ```compile_fail
//! use block::formats::Snapshots;
//! fn apply_under_running_queues(disk: &block::Disk) {
//!     let _ = disk.format().snapshot_apply("before");
//! }
//! ```

use std::sync::Arc;

use crate::disk::Disk;
use crate::error::BlockError;
use crate::formats::registry::{open_image_tools, open_overlay_tools};
use crate::formats::tools::ImageTools;
use crate::lock::ImageLock;
use crate::options::DiskOptions;

/// An image opened by its one owner (a tool, the storage daemon).
///
/// "Exclusive" is about who holds the handle, not the file lock: the
/// locks are the ones [`Disk::open`] takes (shared for a read-only open,
/// where every tool that would change the image fails).
pub struct ExclusiveImage {
    tools: Arc<dyn ImageTools>,
    disk: Disk,
    /// The locks of an [`ExclusiveImage::open_beside`] on the image's
    /// files, released after the image (dropped after `disk`).
    _beside_locks: Vec<ImageLock>,
}

impl ExclusiveImage {
    /// Opens the image (format, backing chain, locks) and resolves its
    /// engine, like [`Disk::open`].
    pub fn open(options: &DiskOptions) -> Result<ExclusiveImage, BlockError> {
        Self::from_tools(open_image_tools(options)?, options)
    }

    /// Opens the qcow2 overlay `options.path`, whose backing file is
    /// `backing`'s image, with `backing`'s open format as its backing
    /// image (the file is not opened again: a running disk holds its
    /// lock). The overlay's header must name `backing`'s path. This is
    /// how a running disk gets its new top (an external snapshot).
    pub fn open_overlay(
        options: &DiskOptions,
        backing: &Disk,
    ) -> Result<ExclusiveImage, BlockError> {
        let tools = open_overlay_tools(
            options,
            Arc::clone(backing.format()),
            &backing.options().path,
        )?;
        Self::from_tools(tools, options)
    }

    /// Opens an image this process holds open already, as
    /// [`ExclusiveImage::open`] does, but takes its locks beside the
    /// first open's ([`crate::lock::lock_image_beside`]) instead of
    /// failing on them: a block job writing a backing file of its
    /// running disk (a commit's base), or the running image reopened over
    /// the chain a stream or a commit left. Images with an external data
    /// file are refused (its lock would need the same care).
    pub fn open_beside(options: &DiskOptions) -> Result<ExclusiveImage, BlockError> {
        let unlocked = DiskOptions {
            lock: false,
            ..options.clone()
        };
        let tools = open_image_tools(&unlocked)?;
        if tools.info().data_file.is_some() {
            return Err(BlockError::Unsupported {
                path: options.path.clone(),
                feature: "a second open of an image with an external data file".into(),
            });
        }
        // The image's own file as its options say, its backing files as
        // a reader, each beside the locks this process holds already.
        let mut locks = Vec::new();
        if options.lock {
            for (i, file) in tools.files().local().iter().enumerate() {
                let mode = match (i, options.force_share) {
                    (0, _) => options.lock_mode(),
                    (_, true) => crate::lock::LockMode::ForceShare,
                    (_, false) => crate::lock::LockMode::Reader,
                };
                locks.push(crate::lock::lock_image_beside(file, &options.path, mode)?);
            }
        }
        let mut image = Self::from_tools(tools, options)?;
        image._beside_locks = locks;
        Ok(image)
    }

    /// Wraps an already opened image (tests that inject faults).
    pub fn from_tools(
        tools: Arc<dyn ImageTools>,
        options: &DiskOptions,
    ) -> Result<ExclusiveImage, BlockError> {
        let disk = Disk::from_format(tools.clone(), options)?;
        Ok(ExclusiveImage {
            tools,
            disk,
            _beside_locks: Vec::new(),
        })
    }

    /// The queue-facing disk: blocking I/O helpers and queues. Its clones
    /// carry no tool capability.
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Snapshots, backing edits, compressed writes, make-empty, resize.
    /// Call them while no request of this image is in flight.
    pub fn tools(&self) -> &dyn ImageTools {
        self.tools.as_ref()
    }

    /// A handle that may resize the disk while queues run.
    pub fn resizer(&self) -> Resizer {
        Resizer {
            tools: self.tools.clone(),
            disk: self.disk.clone(),
        }
    }

    /// Loads the image's persistent dirty bitmaps into the disk's live
    /// bitmaps and marks them in use in the image; [`Disk::close`]
    /// stores them back (`crate::live::attach`). For a read-write open
    /// with `records_bitmaps`; call it before the first guest write.
    /// Fails with the image unchanged.
    pub fn attach_persistent_bitmaps(&self) -> Result<(), BlockError> {
        if self.disk.readonly() || !self.disk.options().records_bitmaps {
            return Ok(());
        }
        crate::live::attach(self.tools.clone(), self.disk.live())
    }

    /// As [`ExclusiveImage::attach_persistent_bitmaps`] for the running
    /// image reopened over a new chain: the bitmaps are not loaded from
    /// the file (the old open moves its own here at the switch), only
    /// stored into it from now on (`crate::live::adopt`).
    pub fn adopt_persistent_bitmaps(&self) {
        if !self.disk.readonly() && self.disk.options().records_bitmaps {
            crate::live::adopt(self.tools.clone(), self.disk.live());
        }
    }

    /// Closes the image cleanly (see [`Disk::close`]).
    pub fn close(self) -> Result<(), BlockError> {
        self.disk.close()
    }
}

/// Resizes a disk whose queues may be running; only
/// [`ExclusiveImage::resizer`] makes one.
///
/// Why that is safe: a format resizes under the same metadata lock its
/// planners take, and publishes the new size atomically after the
/// metadata that covers it is durable, so a request is planned against
/// either the old or the new size, never a half-grown table. Growing adds
/// only unmapped space. Shrinking frees the clusters past the new end, so
/// a write already planned there could land in a freed cluster: qcow2
/// refuses to shrink while an allocating write is in flight, and a caller
/// that shrinks must not have requests to the cut range in flight.
#[derive(Clone)]
pub struct Resizer {
    tools: Arc<dyn ImageTools>,
    disk: Disk,
}

impl Resizer {
    /// Sets the virtual size to `new_size`. A grown area reads as zeroes:
    /// where the backing image is longer than the old size, zeroes are
    /// written over the grown area (as qemu-img does), so its data does
    /// not show through.
    pub fn resize(&self, new_size: u64) -> Result<(), BlockError> {
        let old = self.disk.size();
        self.tools.resize(new_size)?;
        if new_size > old && self.tools.backing_size().is_some_and(|b| b > old) {
            self.disk.write_zeroes(old, new_size - old, false)?;
        }
        Ok(())
    }

    /// The current virtual size.
    pub fn size(&self) -> u64 {
        self.disk.size()
    }
}
