//! `ch-img commit [-q] [-f fmt] [-d] [-p] [-t cache] [-b BASE] FILE`
//!
//! Writes what a qcow2 image allocates into its backing file, then (unless
//! `-d`) empties the image so it reads through to the backing file again,
//! as qemu-img does. The flow (qemu's OFD locks are held during each step;
//! between the steps the files are briefly closed and reopened):
//! 1. open the image read-only *without* its backing chain (so the
//!    backing file is not held open read-only by us) and the backing file
//!    read-write;
//! 2. grow the backing file if the image is larger;
//! 3. copy each extent the image maps itself: data is read and written,
//!    zero clusters become write-zeroes;
//! 4. close both (flushing the backing file), reopen the image read-write
//!    and unmap all of it ([`block::formats::Format::make_empty`]).
//!
//! Only the image's direct backing file can be the target: `-b` naming any
//! other image of the chain is refused.

use block::{DiskOptions, ImageType};

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::{open_image, parse_format};

const SPEC: OptSpec = OptSpec {
    short_with_value: "ftbr",
    short_flags: "qdpUh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

/// Bytes copied per request.
const CHUNK: u64 = 1 << 20;

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let fmt = parse_format(p.value("f"))?;
    // Where the backing file is, as the chain resolves it.
    let info = open_image(path, fmt, true)?.format().info();
    let (Some(backing), Some(shown)) = (info.full_backing_filename, info.backing_filename) else {
        return Err(CliError::Usage("Image does not have a backing file".into()));
    };
    if let Some(base) = p.value("b") {
        if base != shown && base != backing {
            return Err(CliError::Usage(format!(
                "ch-img commit only commits into the image's own backing file ('{shown}'), not '{base}'"
            )));
        }
    }
    let mut opts = DiskOptions::new(path);
    opts.readonly = true;
    opts.no_backing = true;
    opts.image_type = if fmt == ImageType::Auto {
        ImageType::Qcow2
    } else {
        fmt
    };
    let top = ImageIo::open(&opts).map_err(|source| CliError::Open {
        path: path.into(),
        source,
    })?;
    let base = open_image(
        &backing,
        parse_format(info.backing_filename_format.as_deref())?,
        false,
    )?;
    let copied = copy_allocated(&top, &base);
    let closed = base.close().map_err(CliError::Close);
    // Release both files (and their locks) before the image is reopened
    // read-write with its chain.
    drop(base);
    drop(top);
    copied.and(closed)?;
    if !p.flag("d") {
        let top = open_image(path, fmt, false)?;
        let emptied = top
            .format()
            .make_empty()
            .map_err(|source| CliError::Write { offset: 0, source });
        let closed = top.close().map_err(CliError::Close);
        emptied.and(closed)?;
    }
    if !p.flag("q") {
        println!("Image committed.");
    }
    Ok(0)
}

/// Steps 2 and 3 of the module docs.
fn copy_allocated(top: &ImageIo, base: &ImageIo) -> Result<(), CliError> {
    let size = top.size();
    if base.size() < size {
        base.format().resize(size).map_err(CliError::Resize)?;
    }
    let mut buf = vec![0u8; CHUNK as usize];
    let mut pos = 0u64;
    while pos < size {
        let status = top.extent_at(pos, size)?;
        let end = pos + status.len;
        if !(status.depth == 0 && status.present) {
            pos = end;
            continue;
        }
        if status.zero {
            base.write_zeroes(pos, end - pos)
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
        }
    }
    Ok(())
}
