//! `ch-img resize [-f fmt] [--preallocation=MODE] [--shrink] [-q] FILE [+|-]SIZE`
//!
//! Computes the new size (absolute or relative), refuses to shrink without
//! `--shrink` as qemu-img does, and calls the format's `resize` (growing
//! zeroes the new area where a longer backing file would show through,
//! [`crate::image_io::ImageIo::resize`]). `--preallocation` (off, metadata
//! for qcow2, falloc, full) then allocates the grown area
//! ([`block::prealloc::preallocate_grown`]). A resize that fails (ENOSPC
//! while preallocating, EIO) leaves the image as it was
//! ([`crate::image_io::ImageIo::undo_on_failure`]).

use block::prealloc::{preallocate_grown, Preallocation};

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::options::{open_image, parse_format};
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "f",
    short_flags: "qh",
    long_with_value: &["preallocation"],
    long_flags: &["shrink"],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    // "-1M" is a size, not an option: take the last operand out first.
    let (last, rest) = args
        .split_last()
        .ok_or_else(|| CliError::Usage("Expecting image file name and size".into()))?;
    let p = parse(rest, &SPEC)?;
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting image file name and size".into()));
    };
    let preallocation: Preallocation = match p.value("preallocation") {
        Some(v) => v.parse().map_err(CliError::Usage)?,
        None => Preallocation::Off,
    };
    let bad = || CliError::Usage("Invalid image size specified".into());
    let image = open_image(path, parse_format(p.value("f"))?, false)?;
    if preallocation == Preallocation::Metadata && image.format().name() == "raw" {
        return Err(CliError::Usage(
            "Unsupported preallocation mode for raw images: metadata (off, falloc or full)".into(),
        ));
    }
    let current = image.size();
    let new_size = if let Some(d) = last.strip_prefix('+') {
        current
            .checked_add(parse_size(d).ok().ok_or_else(bad)?)
            .ok_or_else(bad)?
    } else if let Some(d) = last.strip_prefix('-') {
        current
            .checked_sub(parse_size(d).ok().ok_or_else(bad)?)
            .ok_or_else(bad)?
    } else {
        parse_size(last).ok().ok_or_else(bad)?
    };
    if new_size < current && !p.flag("shrink") {
        eprintln!("ch-img: Use the --shrink option to perform a shrink operation.");
        eprintln!("ch-img: warning: Shrinking an image will delete all data beyond the shrunken image's end. Before performing such an operation, make sure there is no important data there.");
        return Ok(1);
    }
    // The new size reaches the header only with the grown area: a
    // failure (ENOSPC while preallocating, EIO) puts the image back as it
    // was, header, tables and length.
    image.undo_on_failure(|| {
        image.resize(new_size).map_err(|e| match e {
            // What the image cannot do, in qemu-img's words alone
            // ("Cannot resize NBD nodes").
            CliError::Resize(block::BlockError::CannotDo { reason, .. }) => CliError::Usage(reason),
            e => e,
        })?;
        if new_size > current {
            preallocate_grown(
                image.format().as_ref(),
                std::path::Path::new(path),
                preallocation,
                current,
                new_size,
            )
            .map_err(CliError::Resize)?;
        }
        Ok(())
    })?;
    image.close().map_err(CliError::Close)?;
    if !p.flag("q") {
        println!("Image resized.");
    }
    Ok(0)
}
