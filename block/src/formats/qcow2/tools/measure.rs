//! `ch-img measure -O qcow2`: the bytes a new qcow2 image would take,
//! from the layout arithmetic of [`crate::formats::qcow2::on_disk::layout`]. A new image's options
//! enter ([`measure`]: compat, cluster size, refcount width, extended L2,
//! preallocation, a backing file), checked as qemu's measure checks them;
//! a [`Measure`] leaves, which counts the metadata of a fully allocated
//! image plus the data clusters a copy of the input needs (found with its
//! block status through its whole chain), and for a version 3 copy of a
//! version 3 qcow2 input its persistent bitmaps.

use crate::formats::create_options::CreateOptions;
use crate::formats::format::{status_within, Format, ImageInfo};
use crate::formats::measure::{Measure, MeasureError, Measurement};
use crate::formats::qcow2::on_disk::layout::{bitmaps_size, LayoutParams};
use crate::prealloc::Preallocation;

/// qemu reports sizes of images in whole 512-byte sectors.
const SECTOR: u64 = 512;

/// The new image as its options describe it.
struct Qcow2Measure {
    /// `size` (the asked size, when there is no input).
    size: u64,
    /// preallocation=falloc or full: every data cluster allocated.
    allocates_data: bool,
    /// A backing file: the copy shares nothing known with it, so every
    /// data cluster counts.
    has_backing_file: bool,
    layout: LayoutParams,
    /// Version 3 (compat=1.1).
    v3: bool,
}

/// Checks a new image's options as qemu's measure checks them (not the
/// ones that only change feature bits, such as lazy_refcounts with
/// compat=0.10).
pub(crate) fn measure(opts: &CreateOptions) -> Result<Box<dyn Measure>, String> {
    let cluster_size = opts.cluster_size.unwrap_or(65536);
    let refcount_bits = u64::from(opts.refcount_bits.unwrap_or(16));
    let v3 = match opts.compat.as_deref() {
        None | Some("1.1") => true,
        Some("0.10") => false,
        Some(other) => return Err(format!("Invalid compatibility level: '{other}'")),
    };
    if !cluster_size.is_power_of_two() || !(512..=2 << 20).contains(&cluster_size) {
        return Err("Cluster size must be a power of two between 512 and 2048k".into());
    }
    if opts.extended_l2 && cluster_size < 16384 {
        return Err(
            "Extended L2 entries are only supported with cluster sizes of at least 16384 bytes"
                .into(),
        );
    }
    if !refcount_bits.is_power_of_two() || refcount_bits > 64 {
        return Err("Refcount width must be a power of two and may not exceed 64 bits".into());
    }
    if !v3 && refcount_bits != 16 {
        return Err("Different refcount widths than 16 bits require compatibility level 1.1 or above (use compat=1.1 or greater)".into());
    }
    Ok(Box::new(Qcow2Measure {
        size: opts.size,
        allocates_data: matches!(
            opts.preallocation,
            Preallocation::Falloc | Preallocation::Full
        ),
        has_backing_file: opts.backing_file.is_some(),
        layout: LayoutParams {
            cluster_bits: cluster_size.trailing_zeros(),
            refcount_order: refcount_bits.trailing_zeros(),
            extended_l2: opts.extended_l2,
        },
        v3,
    }))
}

fn too_large() -> MeasureError {
    MeasureError::Refused("The image size is too large (try using a larger cluster size)".into())
}

impl Measure for Qcow2Measure {
    /// All metadata of a fully allocated image, plus the data clusters
    /// the input needs (or all of them with preallocation=falloc or full,
    /// or with a backing file).
    fn measure(&self, input: Option<&dyn Format>) -> Result<Measurement, MeasureError> {
        let layout = &self.layout;
        // qemu checks the L1 table for the size option only, not for an input.
        let asked = layout.round_up(self.size).ok_or_else(too_large)?;
        if !layout.l1_fits(asked) {
            return Err(too_large());
        }
        let (virtual_size, mut data) = match input {
            None => (asked, 0),
            Some(image) => {
                let disk = image.size().next_multiple_of(SECTOR);
                let virtual_size = layout.round_up(disk).ok_or_else(too_large)?;
                let data = if self.has_backing_file {
                    virtual_size
                } else {
                    data_clusters_bytes(image, layout.cluster_size())?
                };
                (virtual_size, data)
            }
        };
        if self.allocates_data {
            data = virtual_size;
        }
        let fully_allocated = layout.fully_allocated(virtual_size).ok_or_else(too_large)?;
        // The open refused a bitmap directory qemu would refuse, so `info`
        // lists every bitmap.
        let bitmaps = match input.map(|image| (image, image.info())) {
            Some((image, info)) if self.v3 && is_qcow2_v3(&info) => {
                let disk = image.size().next_multiple_of(SECTOR);
                Some(bitmaps_size(
                    info.bitmaps.iter().map(|b| b.shape()),
                    disk,
                    layout.cluster_size(),
                ))
            }
            _ => None,
        };
        Ok(Measurement {
            required: fully_allocated - virtual_size + data,
            fully_allocated,
            bitmaps,
        })
    }
}

/// Whether the input is a qcow2 v3 image: only those keep persistent
/// bitmaps, so only then does qemu report a bitmaps size.
fn is_qcow2_v3(info: &ImageInfo) -> bool {
    info.format == "qcow2" && info.compat.as_deref() == Some("1.1")
}

/// Bytes of the output clusters (`cluster_size` each) that hold some of
/// the input's data. Ranges reading as zeroes need none: the copy has no
/// backing file, so an unallocated cluster reads as zeroes too.
fn data_clusters_bytes(image: &dyn Format, cluster_size: u64) -> Result<u64, MeasureError> {
    let size = image.size();
    let mut total = 0;
    let mut pos = 0;
    while pos < size {
        let status =
            status_within(image, pos, size).map_err(|source| MeasureError::BlockStatus {
                offset: pos,
                source,
            })?;
        let end = pos + status.len;
        if status.zero || !(status.data && status.present) {
            pos = end;
            continue;
        }
        // Count every cluster this extent touches; the rest of its last
        // cluster is counted already, so the walk goes on after it.
        let first = pos - pos % cluster_size;
        let last = end.next_multiple_of(cluster_size);
        total += last - first;
        pos = last;
    }
    Ok(total)
}
