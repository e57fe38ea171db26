//! `Qcow2Image`: an opened qcow2 image with its external data file and
//! backing chain, and the open-time checks (feature bits, dirty and
//! corrupt images, autoclear bits, locks).
//!
//! Options and the image's opened descriptor enter; a `Qcow2Image` leaves.
//! Its `Format` implementation is split over `read`, `write`, `zero` and
//! `status`; they share the `State` behind one mutex held only while
//! planning or committing, never during data I/O.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};

use super::backing::{open_backing, resolve};
use super::chain::Chain;
use super::cow::CowReader;
use super::features::{AUTOCLEAR_BITMAPS, AUTOCLEAR_KNOWN, COMPAT_LAZY_REFCOUNTS};
use super::header::{read_header, Header, OFF_AUTOCLEAR};
use super::meta::MetaState;
use super::meta_io::{write_at, MetaIo, MetaKind};
use super::plan_builder::PlanBuilder;
use super::state::{lock, State};
use super::snapshot_table::{read_snapshot_table, TableLocation};
use crate::error::BlockError;
use crate::formats::{FileId, Format, Waker, WriteOutcome, WritePlan};
use crate::lock::ImageLock;
use crate::options::DiskOptions;

pub struct Qcow2Image {
    /// Tells this open image from any other (queue views are bound to it).
    pub(crate) id: u64,
    /// Its files, backing image and header: fixed after open.
    pub(crate) chain: Chain,
    pub(crate) readonly: bool,
    /// Opened to keep the persistent bitmaps valid: guest writes refused
    /// (`DiskOptions::keep_persistent_bitmaps`).
    pub(crate) keeps_bitmaps: bool,
    pub(crate) size: AtomicU64,
    pub(crate) state: Mutex<State>,
    /// Whether `State::compressed` may hold data (read without the lock
    /// on every read and write plan).
    pub(crate) compressed_cached: AtomicBool,
    /// This file's locks and its data file's, released when the image is
    /// dropped (after the `Drop` below has written what it must; see
    /// [`crate::lock`]).
    pub(crate) _lock: Option<ImageLock>,
    pub(crate) _data_file_lock: Option<ImageLock>,
    /// Opened writable without its backing chain (`DiskOptions::no_backing`,
    /// for header edits such as `rebase -u`): guest writes and resizing
    /// are refused, since they would need the backing data.
    pub(crate) backing_unopened: bool,
}

impl Drop for Qcow2Image {
    /// Publishes committed writes whose L2 entries are still only cached,
    /// so dropping without `close` loses nothing the guest saw complete.
    fn drop(&mut self) {
        if self.readonly {
            return;
        }
        let mut st = self.lock();
        if let Err(e) = st.meta.flush_dirty() {
            log::error!(
                "{}: writing cached L2 entries failed: {e}",
                self.chain.path.display()
            );
        }
        if let Err(e) = st.meta.trim_reserve() {
            log::warn!("{}: {e}", self.chain.path.display());
        }
    }
}

/// How a metadata-changing plan starts (see [`Qcow2Image::begin_update`]).
pub(crate) enum UpdateStart<'a> {
    /// Plan under this lock.
    Locked(MutexGuard<'a, State>),
    /// Nothing to plan: the outcome is already known.
    Decided(WriteOutcome),
}

/// The smallest unit the page cache tracks; a cluster smaller than this
/// shares its page with other clusters.
const PAGE_SIZE: u64 = 4096;

impl Qcow2Image {
    /// Refuses O_DIRECT writes to an image whose clusters are smaller than
    /// a page and whose data lives in the image file itself. Metadata goes
    /// through a buffered descriptor; with such clusters an L2 table or a
    /// refcount block can share a page with guest data written directly.
    /// A direct write that lands while that page is dirty in the page cache
    /// cannot drop the cached copy: Linux fails the next fdatasync with EIO
    /// and may later write the stale cached bytes back over the new data
    /// (seen in the replay test, docs/qcow2.md). Refusing is the only safe
    /// answer that does not change the cache mode behind the user's back.
    fn check_direct_writes(opts: &DiskOptions, header: &Header) -> Result<(), BlockError> {
        if opts.direct && header.data_file.is_none() && header.cluster_size() < PAGE_SIZE {
            return Err(BlockError::Unsupported {
                path: opts.path.clone(),
                feature: format!(
                    "writing with O_DIRECT (direct=on, cache=none or directsync) to an image with {}-byte clusters (smaller than a {PAGE_SIZE}-byte page, so metadata and data share pages); open it with a buffered cache mode (writeback, writethrough, unsafe) or read-only",
                    header.cluster_size()
                ),
            });
        }
        Ok(())
    }

    /// Opens the top image of a chain; `file` was opened with `opts`.
    pub fn open(opts: &DiskOptions, file: File) -> Result<Self, BlockError> {
        let canon = opts
            .path
            .canonicalize()
            .map_err(|source| BlockError::Open {
                path: opts.path.clone(),
                source,
            })?;
        Self::open_chain(opts, file, &mut vec![canon])
    }

    pub(crate) fn open_chain(
        opts: &DiskOptions,
        file: File,
        chain: &mut Vec<PathBuf>,
    ) -> Result<Self, BlockError> {
        let path = opts.path.clone();
        let lock = (opts.lock)
            .then(|| crate::lock::lock_image(&file, &path, opts.lock_mode()))
            .transpose()?;
        let meta_file = OpenOptions::new()
            .read(true)
            .write(!opts.readonly)
            .open(&path)
            .map_err(|source| BlockError::Open {
                path: path.clone(),
                source,
            })?;
        let (mut header, mut file_size) = read_header(&meta_file, &path)?;
        // As qemu, refuse a bitmap directory it would refuse to load.
        super::bitmap_directory::bitmaps_of(&meta_file, &header, file_size).map_err(|reason| {
            BlockError::InvalidImage {
                path: path.clone(),
                reason,
            }
        })?;
        // As qemu, refuse a snapshot table beyond its limits (the count,
        // the table's size, each entry's extra data).
        read_snapshot_table(&meta_file, TableLocation::of(&header), file_size).map_err(
            |reason| BlockError::InvalidImage {
                path: path.clone(),
                reason,
            },
        )?;
        if !opts.readonly {
            Self::check_writable_open(&path, &header)?;
            Self::check_direct_writes(opts, &header)?;
            if header.dirty() {
                Self::repair_dirty(&path)?;
                (header, file_size) = read_header(&meta_file, &path)?;
                Self::check_writable_open(&path, &header)?;
                if header.dirty() {
                    return Err(BlockError::InvalidImage {
                        path,
                        reason: "image is still dirty after repairing its refcounts".into(),
                    });
                }
            }
            let known = match opts.keep_persistent_bitmaps {
                true => AUTOCLEAR_KNOWN | AUTOCLEAR_BITMAPS,
                false => AUTOCLEAR_KNOWN,
            };
            let autoclear = header.autoclear & known;
            if header.version >= 3 && autoclear != header.autoclear {
                if header.autoclear & AUTOCLEAR_BITMAPS != 0 {
                    // Say so: backup tools that rely on the bitmaps will
                    // find them gone (qemu drops them on its next open).
                    log::warn!(
                        "{}: its persistent dirty bitmaps become invalid: they are not updated by this program",
                        path.display()
                    );
                }
                write_at(
                    &meta_file,
                    MetaKind::Header,
                    OFF_AUTOCLEAR,
                    &autoclear.to_be_bytes(),
                )?;
                header.autoclear = autoclear;
            }
        }
        let mut files = vec![Arc::new(file)];
        let meta_file = Arc::new(meta_file);
        let mut cow_files = vec![Arc::clone(&meta_file)];
        let mut data_file = FileId(0);
        let mut data_file_lock = None;
        if let Some(name) = header.data_file.clone() {
            let dpath = resolve(&path, &name);
            let mut o = OpenOptions::new();
            o.read(true).write(!opts.readonly);
            if opts.direct {
                o.custom_flags(libc::O_DIRECT);
            }
            let f = o.open(&dpath).map_err(|source| BlockError::Open {
                path: dpath.clone(),
                source,
            })?;
            let b = File::open(&dpath).map_err(|source| BlockError::Open {
                path: dpath.clone(),
                source,
            })?;
            data_file_lock = (opts.lock)
                .then(|| crate::lock::lock_image(&f, &dpath, opts.lock_mode()))
                .transpose()?;
            data_file = FileId(files.len() as u16);
            files.push(Arc::new(f));
            cow_files.push(Arc::new(b));
        }
        let backing_base = files.len() as u16;
        let backing = match header.backing_file.clone() {
            Some(name) if !opts.no_backing => Some(open_backing(
                &path,
                &name,
                header.backing_format.as_deref(),
                opts,
                chain,
            )?),
            _ => None,
        };
        if let Some(b) = &backing {
            if files.len() + b.image.files().len() > usize::from(u16::MAX) {
                return Err(BlockError::InvalidImage {
                    path,
                    reason: "too many files in the chain".into(),
                });
            }
            files.extend(b.image.files().iter().cloned());
            cow_files.extend(b.cow_files.iter().cloned());
        }
        let backing_unopened = opts.no_backing && !opts.readonly && header.backing_file.is_some();
        let mut meta = MetaState::load(&header, meta_file, path.clone(), file_size)?;
        // cache=unsafe skips every flush, the ordering barriers between
        // dependent metadata writes and at close included, as QEMU's
        // BDRV_O_NO_FLUSH does: a crash may then leave anything.
        meta.barriers = opts.cache.flushes();
        let image = Qcow2Image {
            id: super::queue_view::new_image_id(),
            size: AtomicU64::new(header.size),
            compressed_cached: AtomicBool::new(false),
            state: Mutex::new(State::new(meta, header.incompatible)),
            chain: Chain {
                path,
                files,
                cow_files,
                backing,
                backing_base,
                data_file,
                header,
            },
            readonly: opts.readonly,
            keeps_bitmaps: opts.keep_persistent_bitmaps,
            _lock: lock,
            _data_file_lock: data_file_lock,
            backing_unopened,
        };
        if let Some(which) = &opts.snapshot {
            image.view_snapshot(which)?;
        }
        Ok(image)
    }

    /// Read-write opens refuse images whose metadata cannot be trusted.
    fn check_writable_open(path: &Path, h: &Header) -> Result<(), BlockError> {
        let refuse = |reason: &str| BlockError::InvalidImage {
            path: path.to_owned(),
            reason: reason.into(),
        };
        if h.corrupt() {
            return Err(refuse(&format!(
                "refusing a read-write open: {}",
                super::guard::REPAIR_HINT
            )));
        }
        Ok(())
    }

    /// Rebuilds the refcounts of an image left dirty by a crash with lazy
    /// refcounts (from its L1/L2 tables, as qemu does on open), which
    /// also clears the dirty bit. We already hold the writer's lock.
    fn repair_dirty(path: &Path) -> Result<(), BlockError> {
        let report = super::check::check_qcow2(path, Some(super::check::Repair::All))?;
        if report.corruptions != 0 || report.check_errors != 0 {
            return Err(BlockError::InvalidImage {
                path: path.to_owned(),
                reason: format!(
                    "image is dirty and repairing its refcounts left {} corruptions and {} check errors; \
                     run qemu-img check -r all",
                    report.corruptions, report.check_errors
                ),
            });
        }
        log::warn!(
            "{}: image was not closed cleanly (lazy refcounts); rebuilt its refcounts \
             ({} corruptions and {} leaks fixed) and cleared the dirty bit",
            path.display(),
            report.corruptions_fixed,
            report.leaks_fixed
        );
        Ok(())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Buffered descriptors parallel to `files()`.
    pub(crate) fn cow_files(&self) -> &[Arc<File>] {
        &self.chain.cow_files
    }

    /// Images below this one.
    pub(crate) fn backing_layers(&self) -> u32 {
        self.chain.backing_layers()
    }

    /// Sets the dirty bit before the first metadata change of a
    /// lazy-refcounts image.
    pub(crate) fn mark_dirty(&self, st: &mut State) -> Result<(), BlockError> {
        st.mark_dirty(self.chain.header.compatible & COMPAT_LAZY_REFCOUNTS != 0)
    }

    /// Replaces the image's metadata-I/O seam: `wrap` gets the current
    /// implementation and returns the new one (tests install
    /// `meta_faults::FaultyMetaIo` this way). Copy-on-write reads planned
    /// afterwards use it too.
    pub fn wrap_meta_io(&self, wrap: impl FnOnce(Arc<dyn MetaIo>) -> Arc<dyn MetaIo>) {
        let mut st = self.lock();
        let current = Arc::clone(&st.meta.io);
        st.meta.io = wrap(current);
    }

    /// Turns the metadata overlap checks off or on (benchmarks measure
    /// their cost this way; QEMU's `overlap-check=none`). On by default.
    pub fn set_overlap_checks(&self, on: bool) {
        self.lock().meta.overlap_checks = on;
    }

    /// Writes L2 entries at every commit (one fdatasync per allocating
    /// write) instead of batching them until the next flush.
    pub fn set_l2_write_through(&self, on: bool) {
        self.lock().meta.l2_write_through = on;
    }

    /// Turns off fdatasync barriers between dependent metadata writes
    /// (keeps process-crash ordering, loses power-loss ordering).
    pub fn set_write_barriers(&self, on: bool) {
        self.lock().meta.barriers = on;
    }

    /// The common start of every metadata-changing plan (write,
    /// write-zeroes, discard): the range is checked, an empty range is
    /// done, a range overlapping an allocation in flight is blocked (the
    /// waker is kept), and otherwise the image is marked dirty and the
    /// locked state is handed to the planner.
    pub(crate) fn begin_update(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<UpdateStart<'_>, BlockError> {
        self.check_writable(offset, len)?;
        if len == 0 {
            return Ok(UpdateStart::Decided(WriteOutcome::Ready(
                WritePlan::default(),
            )));
        }
        let mut st = self.lock();
        if self.blocked(&mut st, offset, len, waker) {
            return Ok(UpdateStart::Decided(WriteOutcome::Blocked));
        }
        self.mark_dirty(&mut st)?;
        Ok(UpdateStart::Locked(st))
    }

    /// Registers `waker` and says so when the range overlaps an allocation
    /// in flight.
    fn blocked(&self, st: &mut State, offset: u64, len: u64, waker: &Waker) -> bool {
        let cb = self.chain.header.cluster_bits;
        let (first, last) = (offset >> cb, (offset + len - 1) >> cb);
        if st.inflight.overlaps(first, last) {
            st.inflight.wait(waker);
            return true;
        }
        false
    }

    /// Registers the plan's pending commit (its clusters become busy),
    /// then, without the metadata lock, reads the copy-on-write sources
    /// and adds their data writes; a failed read aborts the commit.
    pub(crate) fn finish_plan(
        &self,
        mut st: MutexGuard<'_, State>,
        mut b: PlanBuilder,
    ) -> Result<WriteOutcome, BlockError> {
        // Nothing overwrites metadata (a hostile L2 entry, wrong refcounts):
        // refused before anything is queued; the clusters allocated for
        // the plan leak (the image is now marked corrupt).
        st.meta.check_plan(&b.ops, &b.cow, self.chain.data_file)?;
        let jobs = std::mem::take(&mut b.cow);
        let frees_clusters = !b.pending.release.is_empty();
        let commit = if b.pending.is_empty() {
            None
        } else {
            Some(st.inflight.start(std::mem::take(&mut b.pending)))
        };
        drop(st);
        if let Err(e) = CowReader::new(&self.chain).fill(jobs, &mut b) {
            if let Some(c) = commit {
                Format::abort(self, c);
            }
            return Err(e);
        }
        Ok(WriteOutcome::Ready(WritePlan {
            ops: b.ops,
            commit,
            frees_clusters,
        }))
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        let size = self.size.load(std::sync::atomic::Ordering::Acquire);
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(BlockError::OutOfRange { offset, len, size }),
        }
    }

    /// Writes are refused on read-only opens, on opens that keep the
    /// persistent bitmaps (nothing would record the write in them), and on
    /// writable opens without the backing chain (a partial write would copy
    /// zeroes where the backing data belongs).
    pub(crate) fn check_writable(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        if self.readonly || self.keeps_bitmaps {
            return Err(BlockError::ReadOnly);
        }
        self.check_backing_opened()?;
        self.check_range(offset, len)
    }

    /// Refuses what needs the backing chain on an image opened without it.
    pub(crate) fn check_backing_opened(&self) -> Result<(), BlockError> {
        if self.backing_unopened {
            return Err(BlockError::Unsupported {
                path: self.chain.path.clone(),
                feature: "changing the disk of an image opened without its backing chain".into(),
            });
        }
        Ok(())
    }
}
