//! `ch-img commit [-q] [-f fmt] [-d] [-p] [-t cache] [-b BASE] FILE`
//!
//! Writes what a qcow2 image allocates into its backing file (or, with
//! `-b`, into a deeper base of its chain), then (unless `-d` or `-b`)
//! empties the image so it reads through to the backing file again, as
//! qemu-img does. The flow (qemu's OFD locks are held during each step;
//! between the steps the files are briefly closed and reopened):
//! 1. walk the chain down to the base; open the image and the images
//!    between read-only *without* their backing chains (so the base is not
//!    held open read-only by us) and the base read-write;
//! 2. grow the base if the image is larger (zeroing the new area where
//!    the base's own backing file would show through);
//! 3. copy each extent each image maps itself, from the lowest image up,
//!    each over the ones below: data is read and written, zero clusters
//!    become write-zeroes, and where an image reads past the end of the
//!    one below it, zeroes are written first;
//! 4. close them (flushing the base), reopen the image read-write and
//!    unmap all of it ([`block::formats::BackingEdits::make_empty`]), unless
//!    `-d` or `-b` (which implies `-d`, as in qemu-img).
//!
//! `-t` (default writeback, as qemu-img's) is the cache mode of every
//! image the commit opens.

use block::lock::{lock_path, LockMode};
use block::options::CacheMode;
use block::{DiskOptions, ImageType};

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::{
    open_error, open_image, open_image_cached, parse_cache, parse_format, CacheFlag,
};
use crate::progress::Progress;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "ftbr",
    short_flags: "qdpUh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

/// Bytes copied per request.
const CHUNK: u64 = 1 << 20;
/// Most images looked through for `-b`'s base (a loop in a hostile chain
/// ends here).
const MAX_CHAIN: usize = 64;

/// One image of the chain above the base: its path and format.
struct Layer {
    path: String,
    fmt: ImageType,
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let fmt = parse_format(p.value("f"))?;
    let cache = parse_cache(p.value("t"), CacheMode::Writeback, CacheFlag::Target)?;
    // qemu-img opens the image read-write first: refuse one another
    // process uses in qemu-img's words before anything else. An NBD
    // export has no local lock (its server decides who writes it).
    if !block::engines::nbd::is_nbd_path(std::path::Path::new(path)) {
        drop(
            lock_path(std::path::Path::new(path), LockMode::Writer).map_err(|source| {
                CliError::Open {
                    path: path.into(),
                    source,
                }
            })?,
        );
    }
    let (layers, base_path, base_fmt) = chain_above_base(path, fmt, p.value("b"))?;
    let base = open_image_cached(&base_path, base_fmt, false, cache)?;
    // The layers are open only inside: released (with their locks) before
    // the image is reopened read-write with its chain.
    let mut progress = Progress::new(p.flag("p") && !p.flag("q"), 0);
    // A failure undoes what it can of the base: its metadata and what it
    // appended (clusters it already had are overwritten in place, as
    // qemu-img overwrites them).
    let copied = base.undo_on_failure(|| commit_layers(&layers, &base, cache, &mut progress));
    let closed = base.close().map_err(CliError::Close);
    drop(base);
    copied.and(closed)?;
    // `-b` implies `-d`, as in qemu-img: with a deeper base the images in
    // between no longer read as before, and the top image must keep its
    // data to stay valid.
    if !p.flag("d") && p.value("b").is_none() {
        let top = open_image_cached(path, fmt, false, cache)?;
        let emptied = top.undo_on_failure(|| {
            let emptied = top.tools().make_empty();
            emptied.map_err(|source| CliError::Write { offset: 0, source })
        });
        let closed = top.close().map_err(CliError::Close);
        emptied.and(closed)?;
    }
    progress.finish();
    if !p.flag("q") {
        println!("Image committed.");
    }
    Ok(0)
}

/// The images from `path` down to (not including) the base: the direct
/// backing file, or the one `-b` names (by the name an image of the chain
/// records, or by the path it resolves to); then the base's path and
/// format.
fn chain_above_base(
    path: &str,
    fmt: ImageType,
    wanted: Option<&str>,
) -> Result<(Vec<Layer>, String, ImageType), CliError> {
    let mut layers = vec![Layer {
        path: path.to_string(),
        fmt,
    }];
    loop {
        let Some(cur) = layers.last() else {
            return Err(CliError::Usage("empty chain".into()));
        };
        let info = open_image(&cur.path, cur.fmt, true)?.format().info();
        let (Some(backing), Some(shown)) = (info.full_backing_filename, info.backing_filename)
        else {
            return Err(CliError::Usage(match wanted {
                Some(base) if layers.len() > 1 => {
                    format!("Did not find '{base}' in the backing chain of '{path}'")
                }
                _ => "Image does not have a backing file".into(),
            }));
        };
        let backing_fmt = parse_format(info.backing_filename_format.as_deref())?;
        if wanted.is_none_or(|b| b == shown || b == backing) {
            return Ok((layers, backing, backing_fmt));
        }
        if layers.len() > MAX_CHAIN {
            return Err(CliError::Usage(format!(
                "backing chain of '{path}' is longer than {MAX_CHAIN} images"
            )));
        }
        layers.push(Layer {
            path: backing,
            fmt: backing_fmt,
        });
    }
}

/// Opens one layer read-only *without* its backing chain (so the base is
/// not held open read-only by us).
fn open_layer(layer: &Layer, cache: CacheMode) -> Result<ImageIo, CliError> {
    let mut opts = DiskOptions::new(&layer.path);
    opts.readonly = true;
    opts.no_backing = true;
    opts.direct = cache.direct();
    // A layer above the base has a backing file: probed, its format is
    // one that has them.
    opts.image_type = layer.fmt;
    ImageIo::open(&opts, cache).map_err(|source| open_error(&layer.path, cache, source))
}

/// Writes the top image's view of everything the layers above the base
/// hold into the base: the base grows to the top image's size, then the
/// layers are copied from the lowest up, each over the ones below, so
/// the last word is the top's. Where a layer reads past the end of the
/// image below it (zeroes), zeroes are written first.
fn commit_layers(
    layers: &[Layer],
    base: &ImageIo,
    cache: CacheMode,
    progress: &mut Progress,
) -> Result<(), CliError> {
    let opened = layers
        .iter()
        .map(|layer| open_layer(layer, cache))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(size) = opened.first().map(ImageIo::size) else {
        return Ok(());
    };
    if base.size() < size {
        base.resize(size)?;
    }
    progress.set_total(size * opened.len() as u64);
    // What of each layer the top image sees: up to the smallest size from
    // the top down to it.
    let visible: Vec<u64> = opened
        .iter()
        .scan(size, |v, io| {
            *v = (*v).min(io.size());
            Some(*v)
        })
        .collect();
    for i in (0..opened.len()).rev() {
        // The base itself reads zeroes past its old end (it was grown).
        let below = opened.get(i + 1).map_or(visible[i], ImageIo::size);
        if below < visible[i] {
            base.write_zeroes(below, visible[i] - below, false)
                .map_err(|source| CliError::Write {
                    offset: below,
                    source,
                })?;
        }
        let done_below = size * (opened.len() - 1 - i) as u64;
        copy_allocated(&opened[i], base, visible[i], &mut |pos| {
            progress.update(done_below + pos)
        })?;
    }
    Ok(())
}

/// Copies what `top` (one layer, opened without its chain) maps itself
/// below `size` into `base`: data is read and written, zero clusters
/// become write-zeroes. `progress` hears the position after every
/// extent and every chunk copied.
fn copy_allocated(
    top: &ImageIo,
    base: &ImageIo,
    size: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), CliError> {
    let mut buf = vec![0u8; CHUNK as usize];
    let mut pos = 0u64;
    while pos < size {
        progress(pos);
        let status = top.extent_at(pos, size)?;
        let end = pos + status.len;
        if !(status.depth == 0 && status.present) {
            pos = end;
            continue;
        }
        if status.zero {
            base.write_zeroes(pos, end - pos, false)
                .map_err(|source| CliError::Write {
                    offset: pos,
                    source,
                })?;
            pos = end;
            continue;
        }
        while pos < end {
            let n = (end - pos).min(CHUNK) as usize;
            top.read_at(pos, &mut buf[..n])
                .map_err(|source| CliError::Read {
                    offset: pos,
                    source,
                })?;
            base.write_at(pos, &buf[..n])
                .map_err(|source| CliError::Write {
                    offset: pos,
                    source,
                })?;
            pos += n as u64;
            // Every chunk counts: `-p` moves at every percent.
            progress(pos);
        }
    }
    Ok(())
}
