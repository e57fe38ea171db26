//! From qemu-img's create options to a new qcow2 image: each option
//! checked as qemu-img checks it (the refusal names the option), the
//! backing file opened to check it and learn its size (unless `-u`),
//! then the layout written by `create` ([`create_qcow2`]).

use super::create::{create_qcow2, Qcow2Params};
use crate::error::BlockError;
use crate::formats::create_options::CreateOptions;
use crate::formats::driver::Formats;
use crate::formats::open::open_with;
use crate::formats::qcow2::backing::resolve;
use crate::new_file::FileIdentity;
use crate::options::{DiskOptions, ImageType};
use crate::prealloc::Preallocation;

/// Creates the qcow2 image `opts` describes (checking its backing file,
/// if any, by opening it with `formats`).
pub(crate) fn create_from_options(
    opts: &CreateOptions,
    formats: &Formats,
) -> Result<(), BlockError> {
    let version = match opts.compat.as_deref() {
        None | Some("1.1") | Some("v3") => 3,
        Some("0.10") | Some("v2") => 2,
        Some(other) => {
            return Err(opts.invalid("compat", format!("'{other}' (expected 0.10 or 1.1)")))
        }
    };
    let cluster_size = opts.cluster_size.unwrap_or(65536);
    if !cluster_size.is_power_of_two() || !(512..=2 << 20).contains(&cluster_size) {
        return Err(opts.invalid(
            "cluster_size",
            format!("{cluster_size} is not a power of two from 512 to 2M"),
        ));
    }
    let refcount_bits = opts.refcount_bits.unwrap_or(16);
    if !refcount_bits.is_power_of_two() || refcount_bits > 64 {
        return Err(opts.invalid(
            "refcount_bits",
            format!("{refcount_bits} is not a power of two up to 64"),
        ));
    }
    if version == 2 {
        if refcount_bits != 16 {
            return Err(opts.invalid("refcount_bits", "compat=0.10 images need refcount_bits=16"));
        }
        if opts.lazy_refcounts {
            return Err(opts.invalid("lazy_refcounts", "needs compat=1.1"));
        }
        if opts.extended_l2 {
            return Err(opts.invalid("extended_l2", "needs compat=1.1"));
        }
        if opts.zstd {
            return Err(opts.invalid("compression_type", "zstd needs compat=1.1"));
        }
    }
    if opts.extended_l2 && cluster_size < 16384 {
        return Err(opts.invalid("extended_l2", "needs a cluster size of at least 16 KiB"));
    }
    let backing_format = opts.backing_fmt.and_then(ImageType::name).map(String::from);
    if opts.preallocation != Preallocation::Off && opts.backing_file.is_some() && !opts.extended_l2
    {
        // As qemu-img: preallocated clusters would hide the backing data.
        return Err(opts.invalid(
            "preallocation",
            "a backing file and preallocation need extended_l2=on",
        ));
    }
    if backing_format.is_some() && opts.backing_file.is_none() {
        return Err(opts.invalid("backing_fmt", "given without backing_file"));
    }
    let mut size = opts.size;
    if opts.unsafe_backing && size == 0 {
        return Err(opts.invalid("size", "Image creation needs a size parameter"));
    }
    // The backing chain is a source: the new image must not replace it.
    let mut sources = opts.sources.clone();
    if let Some(name) = opts.backing_file.as_ref().filter(|_| opts.unsafe_backing) {
        let bpath = resolve(&opts.path, name);
        sources.extend(FileIdentity::of_path(&bpath).ok());
    }
    if let Some(name) = opts.backing_file.as_ref().filter(|_| !opts.unsafe_backing) {
        // Like qemu-img, open the backing file to check it (and learn the size).
        let bpath = resolve(&opts.path, name);
        let bopts = DiskOptions {
            path: bpath,
            readonly: true,
            image_type: opts.backing_fmt.unwrap_or_default(),
            lock: false,
            ..Default::default()
        };
        let backing = open_with(formats, &bopts)
            .map_err(|e| opts.invalid("backing_file", format!("cannot open {name}: {e}")))?;
        if size == 0 {
            size = backing.size();
        }
        sources.extend(
            backing
                .files()
                .local()
                .iter()
                .filter_map(|f| FileIdentity::of(f).ok()),
        );
    }
    let size = size.div_ceil(512) * 512;
    create_qcow2(
        &opts.path,
        &Qcow2Params {
            size,
            cluster_bits: cluster_size.trailing_zeros(),
            version,
            refcount_order: refcount_bits.trailing_zeros(),
            lazy_refcounts: opts.lazy_refcounts,
            extended_l2: opts.extended_l2,
            zstd: opts.zstd,
            backing_file: opts.backing_file.clone(),
            backing_format,
            preallocation: opts.preallocation,
            sources,
        },
    )
}
