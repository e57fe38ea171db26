//! `ch-img rebase [-f fmt] [-u] [-q] [-p] [-t cache] [-T cache] -b BACKING
//! [-F BACKING_FMT] FILE`
//!
//! Changes the backing file of a qcow2 image. Safe mode (the default)
//! keeps what the disk reads: every range the image does not allocate
//! itself is read through the old chain and from the new backing file
//! (zeroes past its end, or everywhere with `-b ""`), and where they
//! differ the old data is written into the image, a cluster at a time;
//! then the header names the new backing file
//! ([`block::formats::BackingEdits::set_backing_file`]). `-u` only changes the
//! header and never opens the old backing chain (so it repairs an image
//! whose backing file moved). As in qemu-img 7.2, a non-empty `-b` needs
//! `-F`, and a relative `-b` is relative to the image's folder; `-U`
//! reads the old and new chains while others may write them.
//!
//! `-t` is the cache mode of the image and its old chain, `-T` that of
//! the new backing file (both default writeback, as qemu-img's).

use std::path::Path;

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::image_io::ImageIo;
use block::options::CacheMode;
use block::BlockError;

use crate::options::{
    force_share, open_header_only, open_reader, open_with, parse_cache, parse_format, CacheFlag,
};
use crate::progress::Progress;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "fbFtT",
    short_flags: "upqcUh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let unsafe_mode = p.flag("u");
    if p.flag("c") {
        return Err(CliError::Usage(
            "ch-img rebase does not compress the data it copies (-c)".into(),
        ));
    }
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let backing = match p.value("b") {
        Some(b) => b,
        None if unsafe_mode => "",
        None => {
            return Err(CliError::Usage(
                "Must specify backing file (-b) or use unsafe mode (-u)".into(),
            ))
        }
    };
    let backing_fmt = p.value("F");
    if !backing.is_empty() && backing_fmt.is_none() {
        return Err(CliError::Usage(format!(
            "Could not change the backing file to '{backing}': backing format must be specified"
        )));
    }
    let cache = parse_cache(p.value("t"), CacheMode::Writeback, CacheFlag::Target)?;
    let src_cache = parse_cache(p.value("T"), CacheMode::Writeback, CacheFlag::Source)?;
    let fmt = parse_format(p.value("f"))?;
    let shared = force_share(&p);
    // `-u` never opens the old backing chain (it may be missing); `-U`
    // lets the chains be read while others write them, as in qemu-img.
    let image = if unsafe_mode {
        open_header_only(path, fmt, cache)?
    } else {
        open_with(path, fmt, false, shared, cache)?
    };
    // A failure (ENOSPC, EIO) puts the image back as it was.
    let result = image.undo_on_failure(|| {
        if !unsafe_mode {
            let new = if backing.is_empty() {
                None
            } else {
                let resolved = Path::new(path)
                    .parent()
                    .map(|d| d.join(backing))
                    .filter(|_| !Path::new(backing).is_absolute())
                    .unwrap_or_else(|| backing.into());
                let resolved = resolved.to_string_lossy().into_owned();
                Some(
                    open_reader(&resolved, parse_format(backing_fmt)?, src_cache, shared).map_err(
                        |e| match e {
                            CliError::Open { source, .. } => CliError::Usage(format!(
                                "Could not open new backing file '{backing}': {source}"
                            )),
                            CliError::OpenFile { path, reason } => CliError::Usage(format!(
                                "Could not open new backing file '{backing}': Could not open '{path}': {reason}"
                            )),
                            CliError::OpenNbd { reason, .. } => CliError::Usage(format!(
                                "Could not open new backing file '{backing}': {reason}"
                            )),
                            other => other,
                        },
                    )?,
                )
            };
            let mut progress = Progress::new(p.flag("p") && !p.flag("q"), image.size());
            copy_differences(&image, new.as_ref(), &mut progress)?;
            progress.finish();
        }
        let name = (!backing.is_empty()).then_some(backing);
        image
            .tools()
            .set_backing_file(name, name.and(backing_fmt))
            .map_err(|source| match source {
                // What the image cannot do, as qemu-img says it.
                BlockError::CannotDo { .. } => CliError::Usage(format!(
                    "Could not change the backing file to '{backing}': {}",
                    crate::error::os_message(&std::io::Error::from_raw_os_error(source.errno()))
                )),
                source => CliError::Write { offset: 0, source },
            })
    });
    let closed = image.close().map_err(CliError::Close);
    result.and(closed)?;
    Ok(0)
}

/// Safe mode's copy (see the module docs).
fn copy_differences(
    image: &ImageIo,
    new: Option<&ImageIo>,
    progress: &mut Progress,
) -> Result<(), CliError> {
    let size = image.size();
    let cs = image.format().info().cluster_size.unwrap_or(65536);
    let new_size = new.map_or(0, ImageIo::size);
    let mut old_buf = vec![0u8; cs as usize];
    let mut new_buf = vec![0u8; cs as usize];
    let mut pos = 0u64;
    while pos < size {
        progress.update(pos);
        let status = image.extent_at(pos, size)?;
        let end = pos + status.len;
        if status.depth == 0 && status.present {
            // The image's own data (or zero clusters): the backing file
            // does not show through.
            pos = end;
            continue;
        }
        while pos < end {
            let n = ((pos / cs + 1) * cs).min(end) - pos;
            let (old, fresh) = (&mut old_buf[..n as usize], &mut new_buf[..n as usize]);
            image.read_at(pos, old).map_err(|source| CliError::Read {
                offset: pos,
                source,
            })?;
            fresh.fill(0);
            if let Some(new) = new.filter(|_| pos < new_size) {
                let m = n.min(new_size - pos) as usize;
                new.read_at(pos, &mut fresh[..m])
                    .map_err(|source| CliError::Read {
                        offset: pos,
                        source,
                    })?;
            }
            if old != fresh {
                image.write_at(pos, old).map_err(|source| CliError::Write {
                    offset: pos,
                    source,
                })?;
            }
            pos += n;
        }
    }
    Ok(())
}
