//! `ch-img amend` for qcow2: changing the version (compat 0.10 <-> 1.1),
//! lazy refcounts, the refcount width, the external data file's name and
//! its raw flag, in place; what qemu-img 7.2 allows, refused where it
//! refuses, in its words.
//!
//! An [`Amendment`] enters [`Amender`], which works on the image's locked
//! state and its disk size. [`Amender::plan`] checks all of it against
//! the image before anything is written, in the order qemu-img meets its
//! refusals (so the first message is qemu-img's), and leaves a [`Plan`].
//! Then, the image staying valid and reading the same at every step:
//! 1. upgrade: a snapshot table whose entries lack version 3's extra
//!    data is rewritten first (a version 2 image may carry them);
//! 2. downgrade: zero clusters become what version 2 can say
//!    (`zero_expand`);
//! 3. a new refcount width: a complete set of refcount structures in the
//!    new width is written after the end of the file
//!    (`refcount_layout`), counting what the old ones count except
//!    themselves;
//! 4. one write of the whole header cluster switches to the new version,
//!    feature bits, refcount structures and extensions
//!    (`header_cluster`); a barrier makes it durable;
//! 5. a downgrade drops the persistent bitmaps (version 2 cannot keep
//!    them) and frees their clusters.
//!
//! The amend runs as a tool operation that undoes itself when it fails
//! (`undo`, the image's `FailureUndo`): every byte it overwrote inside
//! the file is written back and the file is cut to its old length (the
//! new refcount structures lay beyond it), whatever step failed (a failed
//! barrier after the header write included). So a failed amend leaves the
//! file as it was: header, contents, refcounts, and the zero clusters a
//! failed downgrade had already expanded. qemu-img applies the options
//! one after the other and may stop half way; this never does.
//!
//! After an amend the image's in-memory metadata is reloaded from the new
//! header, so closing the handle writes nothing stale.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;

use super::refcount_layout::RefcountLayout;
use super::snapshot_ops::Snapshotter;
use super::tree::load_table;
use super::zero_expand::expand_zero_clusters;
use crate::error::BlockError;
use crate::formats::amendment::{AmendProgress, AmendStep, Amendment};
use crate::formats::holes::file_size;
use crate::formats::qcow2::bitmaps::bitmap_store::bitmap_clusters;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::MetaKind;
use crate::formats::qcow2::on_disk::features::{
    AUTOCLEAR_DATA_FILE_RAW, COMPAT_LAZY_REFCOUNTS, INCOMPAT_COMPRESSION, INCOMPAT_DIRTY,
};
use crate::formats::qcow2::on_disk::header::{Header, EXT_DATA_FILE};
use crate::formats::qcow2::on_disk::header_cluster::{
    current_header, HeaderCluster, EXT_FEATURE_TABLE,
};
use crate::formats::qcow2::on_disk::l2_entry::L2Entry;
use crate::formats::qcow2::on_disk::refcount::max_refcount;
use crate::formats::qcow2::on_disk::snapshot_table::read_snapshot_table;
use crate::formats::qcow2::state::State;
use crate::formats::Compression;

use crate::formats::qcow2::bitmaps::bitmap_directory::EXT_BITMAPS;

/// What a checked amendment does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    version: u32,
    lazy_refcounts: bool,
    refcount_order: u32,
    data_file_raw: bool,
    data_file: Option<String>,
    /// Version 2 to 3 with snapshot entries lacking the extra data.
    rewrite_snapshots: bool,
}

fn refused(message: &str) -> BlockError {
    BlockError::Refused(message.into())
}

/// See the module docs.
pub(crate) struct Amender<'a> {
    pub st: &'a mut State,
    pub size: &'a AtomicU64,
}

impl Amender<'_> {
    /// Checks `a` against the image (see the module docs for the order).
    pub fn plan(&mut self, a: &Amendment) -> Result<Plan, BlockError> {
        let meta = &mut self.st.meta;
        let h = current_header(meta)?;
        let version = a.version.unwrap_or(h.version);
        if a.data_file.is_some() && !h.has_data_file() {
            return Err(refused(
                "data-file can only be set for images that use an external data file",
            ));
        }
        let raw_now = h.autoclear & AUTOCLEAR_DATA_FILE_RAW != 0;
        if a.data_file_raw == Some(true) && !raw_now {
            return Err(refused("data-file-raw cannot be set on existing images"));
        }
        let bits = a.refcount_bits.unwrap_or(1 << h.refcount_order);
        if bits == 0 || bits > 64 || !bits.is_power_of_two() {
            return Err(refused(
                "Refcount width must be a power of two and may not exceed 64 bits",
            ));
        }
        let order = bits.trailing_zeros();
        if order != h.refcount_order {
            if version < 3 && bits != 16 {
                return Err(refused("Refcount widths other than 16 bits require compatibility level 1.1 or above (use compat=1.1 or greater)"));
            }
            check_refcounts_fit(meta, order)?;
        }
        if let Some((file, format)) = &a.backing {
            if *file != h.backing_file || *format != h.backing_format {
                return Err(refused(
                    "Cannot amend the backing file\nYou can use 'ch-img rebase' instead.",
                ));
            }
        }
        let lazy_now = h.compatible & COMPAT_LAZY_REFCOUNTS != 0;
        let lazy = a.lazy_refcounts.unwrap_or(lazy_now);
        if lazy && !lazy_now && version < 3 {
            return Err(refused("Lazy refcounts only supported with compatibility level 1.1 and above (use compat=1.1 or greater)"));
        }
        let (snapshots, _) =
            read_snapshot_table(meta.io(), meta.snapshot_table(), meta.file_size())
                .map_err(|r| meta.invalid(r))?;
        if version < h.version {
            if order != 4 {
                return Err(refused("compat=0.10 requires refcount_bits=16"));
            }
            if h.has_data_file() {
                return Err(refused("Cannot downgrade an image with a data file"));
            }
            let size = a.size.unwrap_or(h.size);
            if snapshots.iter().any(|s| {
                s.vm_state_size > u64::from(u32::MAX) || s.disk_size.unwrap_or(size) != size
            }) {
                return Err(refused("Internal snapshots prevent downgrade of image"));
            }
            let other = h.incompatible & !(INCOMPAT_COMPRESSION | INCOMPAT_DIRTY);
            if other != 0 {
                return Err(refused(&format!(
                    "Cannot downgrade an image with incompatible features {other:#x} set"
                )));
            }
            if h.incompatible & INCOMPAT_COMPRESSION != 0 && has_compressed_clusters(meta)? {
                return Err(refused("Cannot downgrade an image with zstd compression type and existing compressed clusters"));
            }
        }
        Ok(Plan {
            version,
            // Version 2 has no feature bits.
            lazy_refcounts: lazy && version >= 3,
            refcount_order: order,
            data_file_raw: a.data_file_raw.unwrap_or(raw_now) && version >= 3,
            data_file: a.data_file.clone(),
            rewrite_snapshots: version > h.version
                && snapshots.iter().any(|s| s.disk_size.is_none()),
        })
    }

    /// Checks and applies `a` (see the module docs for the steps).
    pub fn apply(&mut self, a: &Amendment, progress: AmendProgress<'_>) -> Result<(), BlockError> {
        let meta = &mut self.st.meta;
        meta.flush_dirty()?;
        meta.barrier()?;
        meta.trim_reserve()?;
        let plan = self.plan(a)?;
        let upgrading = plan.version > current_header(&self.st.meta)?.version;
        if upgrading {
            progress(AmendStep::Upgrading, 0, 2);
            if plan.rewrite_snapshots {
                Snapshotter::begin(&mut self.st.meta, self.size)?.rewrite_table()?;
            }
            progress(AmendStep::Upgrading, 1, 2);
        }
        let st = &mut *self.st;
        let meta = &mut st.meta;
        let before = current_header(meta)?;
        let downgrading = plan.version < before.version;
        // Bitmaps a downgrade drops (version 2 has nowhere to keep them).
        let dropped_bitmaps = match downgrading {
            true => bitmap_clusters(meta, &before)?,
            false => Vec::new(),
        };
        if downgrading {
            let has_backing = before.backing_file.is_some();
            expand_zero_clusters(meta, has_backing, &mut |done, total| {
                progress(AmendStep::Downgrading, done, total)
            })?;
            meta.barrier()?;
            meta.trim_reserve()?;
        }
        let old = current_header(meta)?;
        let new = switch_header(meta, &old, &plan, &mut *progress)?;
        if upgrading {
            progress(AmendStep::Upgrading, 2, 2);
        }
        // The header now names the new structures: reload what the open
        // image knows from it, then free what only the old header named.
        let file = meta.file().clone();
        let io = meta.io().clone();
        let barriers = meta.barriers();
        let file_size = file_size(&file).map_err(|source| BlockError::Open {
            path: meta.path().to_path_buf(),
            source,
        })?;
        let mut fresh = MetaState::load(&new, file, io, meta.path().to_path_buf(), file_size)?;
        fresh.set_barriers(barriers);
        *meta = fresh;
        st.incompatible = new.incompatible;
        if dropped_bitmaps.is_empty() {
            return Ok(());
        }
        // The amend is done (its header is durable); what is left to do
        // can only leak clusters if it fails.
        let meta = &mut st.meta;
        let freed = dropped_bitmaps
            .iter()
            .try_for_each(|&(first, count)| meta.change_refcounts(first, count, -1))
            .and_then(|()| meta.barrier());
        if let Err(e) = freed {
            log::warn!(
                "{}: the dropped bitmaps' clusters may stay leaked ({e}); `ch-img check -r leaks` frees them",
                meta.path().display()
            );
        }
        Ok(())
    }
}

/// Whether the active disk maps any compressed cluster.
fn has_compressed_clusters(meta: &mut MetaState) -> Result<bool, BlockError> {
    for i in 0..meta.l1().len() {
        let Some((off, _)) = meta.l2_table(i)? else {
            continue;
        };
        let table = load_table(meta, off)?;
        let words = meta.geometry().l2_entry_size as usize / 8;
        for j in 0..meta.geometry().l2_entries as usize {
            let raw = crate::formats::qcow2::metadata::meta_io::be64_at(&table, j * words);
            let e = meta.decode_l2(raw)?;
            if matches!(e, L2Entry::Compressed(_)) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Steps 3 and 4: new refcount structures (if the width changes) and
/// the new header cluster, each made durable. Returns the new header.
fn switch_header(
    meta: &mut MetaState,
    old: &Header,
    plan: &Plan,
    progress: AmendProgress<'_>,
) -> Result<Header, BlockError> {
    let mut hc = HeaderCluster::read(meta.io(), old, meta.path())?;
    let h = &mut hc.header;
    if plan.refcount_order != old.refcount_order {
        let layout = new_refcounts(meta, plan.refcount_order, &mut |done, total| {
            progress(AmendStep::ChangingRefcountWidth, done, total)
        })?;
        h.refcount_order = plan.refcount_order;
        h.refcount_table_offset = layout.table_offset();
        h.refcount_table_clusters = layout.table_clusters as u32;
    }
    h.version = plan.version;
    if plan.lazy_refcounts {
        h.compatible |= COMPAT_LAZY_REFCOUNTS;
    } else {
        h.compatible &= !COMPAT_LAZY_REFCOUNTS;
    }
    if plan.data_file_raw {
        h.autoclear |= AUTOCLEAR_DATA_FILE_RAW;
    } else {
        h.autoclear &= !AUTOCLEAR_DATA_FILE_RAW;
    }
    if plan.version < 3 {
        // Version 2 has no feature bits, compression type or bitmaps.
        h.incompatible = 0;
        h.compatible = 0;
        h.autoclear = 0;
        h.compression = Compression::Deflate;
        hc.set_extension(EXT_BITMAPS, None);
        hc.set_extension(EXT_FEATURE_TABLE, None);
    }
    if let Some(name) = &plan.data_file {
        hc.set_extension(EXT_DATA_FILE, Some(name.as_bytes().to_vec()));
    }
    let bytes = hc.encode(meta.path())?;
    meta.write(MetaKind::Header, 0, &bytes)?;
    meta.barrier()?;
    let new = Header::parse_with(&bytes, file_size(meta.file()).unwrap_or(u64::MAX), true)
        .map_err(|_| meta.invalid("the amended header does not parse"))?;
    Ok(new)
}

/// Refuses a narrower refcount width that some cluster's refcount does
/// not fit, as qemu-img words it.
fn check_refcounts_fit(meta: &mut MetaState, order: u32) -> Result<(), BlockError> {
    let max = max_refcount(order);
    if max >= max_refcount(meta.geometry().refcount_order) {
        return Ok(());
    }
    let clusters = meta.file_size().div_ceil(meta.geometry().cluster_size);
    for c in 0..clusters {
        let n = meta.refcount(c)?;
        if n > max {
            return Err(refused(&format!(
                "Cannot decrease refcount entry width to {} bits: Cluster at offset {:#x} has a refcount of {n}",
                1u32 << order,
                c << meta.geometry().cluster_bits
            )));
        }
    }
    Ok(())
}

/// Writes refcount structures of width `1 << order` after the end of the
/// file, counting every cluster as the current ones do, except the
/// current table and blocks (free once the header leaves them); then a
/// barrier. Progress is reported as qemu-img reports it ([`WalkReport`]).
fn new_refcounts(
    meta: &mut MetaState,
    order: u32,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RefcountLayout, BlockError> {
    let cs = meta.geometry().cluster_size;
    let cb = meta.geometry().cluster_bits;
    let start = meta.file_size().div_ceil(cs);
    let layout = RefcountLayout::fit(start, cb, order)?;
    let mut old_structures: HashSet<u64> = meta.refcount_blocks().iter().map(|o| o >> cb).collect();
    let table_clusters = (meta.refcount_table().0.len() as u64 * 8).div_ceil(cs);
    old_structures.extend((0..table_clusters).map(|i| (meta.refcount_table().1 >> cb) + i));
    let io = meta.io().clone();
    let report = std::cell::RefCell::new(WalkReport::new(
        meta.refcount_table().0.len() as u64,
        progress,
    ));
    let work = layout.end().max(1);
    let mut count = |c: u64| {
        report.borrow_mut().advance(c + 1, work);
        match old_structures.contains(&c) {
            true => Ok(0),
            false => meta.refcount(c),
        }
    };
    layout.write(&*io, &mut count, &mut |done, blocks| {
        if done == blocks {
            report.borrow_mut().advance(work, work);
        }
    })?;
    meta.sync()?;
    Ok(layout)
}

/// qemu-img reports a refcount width change as three walks over the
/// refcount table (two that allocate the new blocks, one that writes
/// them), one unit per table entry: `(units done, 3 * entries)`. Our
/// change is one pass that counts every cluster; its position is
/// reported in qemu's units, every unit in turn, so `amend -p` prints
/// the percentages qemu-img prints, at every percent, as the work goes.
struct WalkReport<'a> {
    sent: Option<u64>,
    total: u64,
    progress: &'a mut dyn FnMut(u64, u64),
}

impl<'a> WalkReport<'a> {
    fn new(table_entries: u64, progress: &'a mut dyn FnMut(u64, u64)) -> Self {
        WalkReport {
            sent: None,
            total: 3 * table_entries.max(1),
            progress,
        }
    }

    /// `done` of `work` is finished: report every unit up to it.
    fn advance(&mut self, done: u64, work: u64) {
        let target = u64::try_from(u128::from(self.total) * u128::from(done) / u128::from(work))
            .unwrap_or(self.total)
            .min(self.total);
        let mut next = self.sent.map_or(0, |s| s + 1);
        while next <= target {
            (self.progress)(next, self.total);
            self.sent = Some(next);
            next += 1;
        }
    }
}
