//! Raw's entry in the format registry ([`DRIVER`]): opening a raw file
//! (locked as qemu locks it), creating one (sparse, or preallocated),
//! measuring one, and what `-o help` lists for it. Raw claims no header:
//! it is what an image no other format claims is.

use std::fs::File;
use std::sync::Arc;

use super::image::RawImage;
use crate::error::BlockError;
use crate::formats::create_options::CreateOptions;
use crate::formats::driver::{
    BackingOpen, FormatDriver, Formats, OpenContext, OpenedBacking, OptionDoc, SIZE_OPTION,
};
use crate::formats::format::Format;
use crate::formats::lacking::Lacking;
use crate::formats::measure::{Measure, MeasureError, Measurement};
use crate::formats::tools::ImageTools;
use crate::new_file::open_for_create;
use crate::options::DiskOptions;
use crate::prealloc::{preallocate_range, Preallocation};

/// See the module docs.
pub static DRIVER: FormatDriver = FormatDriver {
    name: "raw",
    probe: None,
    open,
    open_backing,
    create,
    check: None,
    measure,
    formatting,
    create_options: &[SIZE_OPTION],
    create_options_with_file: &[PREALLOCATION, SIZE_OPTION],
    amend_options: None,
    backing_files: false,
    compressed_clusters: false,
};

/// With a file name qemu-img adds the file protocol's options: for raw,
/// preallocation.
const PREALLOCATION: OptionDoc = OptionDoc::new(
    "preallocation",
    "str",
    "Preallocation mode (allowed values: off, falloc, full)",
);

fn open(
    opts: &DiskOptions,
    file: File,
    ctx: OpenContext<'_>,
) -> Result<Arc<dyn ImageTools>, BlockError> {
    if opts.snapshot.is_some() {
        return Err(Lacking {
            image: opts.path.display().to_string(),
            format: "raw",
        }
        .snapshot_view());
    }
    let lock = (opts.lock)
        .then(|| crate::lock::lock_image(&file, &opts.path, opts.lock_mode()))
        .transpose()?;
    Ok(Arc::new(
        RawImage::new(&opts.path, Arc::new(file), opts.readonly, ctx.probed)?.with_lock(lock),
    ))
}

fn open_backing(b: BackingOpen<'_>) -> Result<OpenedBacking, BlockError> {
    let lock = (b.opts.lock)
        .then(|| crate::lock::lock_image(&b.file, &b.opts.path, b.opts.lock_mode()))
        .transpose()?;
    let image = RawImage::new(&b.opts.path, Arc::new(b.file), true, b.probed)?.with_lock(lock);
    Ok(OpenedBacking {
        image: Arc::new(image),
        buffered: vec![Arc::new(b.buffered)],
        layers: 1,
    })
}

/// Refuses the options a raw image does not take.
pub(crate) fn check_options(opts: &CreateOptions) -> Result<(), BlockError> {
    if opts.backing_file.is_some() {
        return Err(opts.invalid("backing_file", "raw images have no backing file"));
    }
    for (set, name) in [
        (opts.cluster_size.is_some(), "cluster_size"),
        (opts.compat.is_some(), "compat"),
        (opts.refcount_bits.is_some(), "refcount_bits"),
        (opts.lazy_refcounts, "lazy_refcounts"),
        (opts.extended_l2, "extended_l2"),
        (opts.zstd, "compression_type"),
    ] {
        if set {
            return Err(opts.invalid(name, "not a raw image option"));
        }
    }
    if opts.preallocation == Preallocation::Metadata {
        return Err(opts.invalid(
            "preallocation",
            "metadata is for qcow2; raw images take off, falloc or full",
        ));
    }
    Ok(())
}

fn create(opts: &CreateOptions, _formats: &Formats) -> Result<(), BlockError> {
    check_options(opts)?;
    let (f, _lock) = open_for_create(&opts.path, &opts.sources)?;
    preallocate_range(&f, &opts.path, opts.preallocation, 0, opts.size)?;
    f.sync_all().map_err(BlockError::Flush)
}

fn formatting(o: &CreateOptions) -> String {
    format!(
        "Formatting '{}', fmt=raw size={}{}",
        o.path.display(),
        o.size,
        o.shown_preallocation()
    )
}

/// qemu reports sizes of images in whole 512-byte sectors.
const SECTOR: u64 = 512;

/// A raw copy takes the disk's size, rounded up to whole sectors; holes
/// count as they still belong to the file.
struct RawMeasure {
    size: u64,
}

fn measure(opts: &CreateOptions) -> Result<Box<dyn Measure>, String> {
    Ok(Box::new(RawMeasure { size: opts.size }))
}

impl Measure for RawMeasure {
    fn measure(&self, input: Option<&dyn Format>) -> Result<Measurement, MeasureError> {
        let size = input.map_or(self.size, |i| i.size());
        // Sizes are below 2^63, so rounding up to a sector fits.
        let size = size.next_multiple_of(SECTOR);
        Ok(Measurement {
            required: size,
            fully_allocated: size,
            bitmaps: None,
        })
    }
}
