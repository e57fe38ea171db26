//! `ch-img compare [-f fmt] [-F fmt] [-T src_cache] [-p] [-q] [-s] [-U] FILE1 FILE2`
//!
//! Walks both images as qemu-img 7.2 does: over their common size, one
//! step per pair of block-status extents (the shorter of the two): ranges
//! both read as zeroes are skipped; where both are allocated (anywhere in
//! their chains) the step (at most 2 MiB) is read from both and compared;
//! where one is, it must read as zeroes. The first difference is reported
//! as qemu-img does ("Content mismatch at offset N!", N rounded down to a
//! 512-byte sector). When the sizes differ, "Warning: Image size
//! mismatch!" and the longer image's tail must read as zeroes. With `-s`
//! (strict) a size difference is a mismatch, and so is a difference in
//! allocation status (present, zero, data flags of `block_status`).
//!
//! `-p` reports progress after every step with qemu's arithmetic
//! ([`StepProgress`], at least 2 points between prints) and ends with a
//! newline after the verdict, as qemu-img does. Exit 0 identical, 1
//! different, 2 error. `-T` is the cache mode both images are read in
//! (default writeback, as qemu-img's).

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::progress::StepProgress;
use block::options::CacheMode;

use crate::options::{force_share, open_reader, parse_cache, parse_format, CacheFlag};

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "fFT",
    short_flags: "sqpUh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

/// qemu-img's IO_BUF_SIZE: the most one step reads from each image.
const STEP: u64 = 2 << 20;

/// Where a walk over the images stopped.
enum Verdict {
    Identical,
    /// Printed already; exit status 1.
    Different,
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let [a, b] = p.operands.as_slice() else {
        return Err(CliError::Syntax("Expecting two image file names".into()));
    };
    let quiet = p.flag("q");
    let cache = parse_cache(p.value("T"), CacheMode::Writeback, CacheFlag::Source)?;
    let fmt1 = parse_format(p.value("f"))?;
    let fmt2 = parse_format(p.value("F").or(p.value("f")))?;
    // qemu-img starts the report before it opens the images, so a
    // failure still ends it with its newline.
    let mut progress = StepProgress::new(p.flag("p") && !quiet, 2.0);
    let shared = force_share(&p);
    let opened = (fmt1, fmt2, cache, shared);
    let verdict = open_and_compare(a, b, opened, quiet, p.flag("s"), &mut progress);
    progress.end();
    match verdict? {
        Verdict::Identical => Ok(0),
        Verdict::Different => Ok(1),
    }
}

fn open_and_compare(
    a: &str,
    b: &str,
    (fmt1, fmt2, cache, shared): (block::ImageType, block::ImageType, CacheMode, bool),
    quiet: bool,
    strict: bool,
    progress: &mut StepProgress,
) -> Result<Verdict, CliError> {
    let img1 = open_reader(a, fmt1, cache, shared)?;
    let img2 = open_reader(b, fmt2, cache, shared)?;
    let say = |text: String| {
        if !quiet {
            println!("{text}");
        }
    };
    progress.add(0, 1);
    let (s1, s2) = (img1.size(), img2.size());
    if strict && s1 != s2 {
        say("Strict mode: Image size mismatch!".into());
        return Ok(Verdict::Different);
    }
    let (common, total) = (s1.min(s2), s1.max(s2));
    let mut pos = 0u64;
    while pos < common {
        let (x, y) = (img1.extent_at(pos, s1)?, img2.extent_at(pos, s2)?);
        let mut step = x.len.min(y.len);
        if strict && (x.present, x.zero, x.data) != (y.present, y.zero, y.data) {
            say(format!("Strict mode: Offset {pos} block status mismatch!"));
            return Ok(Verdict::Different);
        }
        let difference = if x.zero && y.zero {
            None
        } else if x.present == y.present {
            step = step.min(STEP);
            match x.present {
                true => first_difference(&img1, Some(&img2), pos, pos + step)?,
                false => None,
            }
        } else {
            step = step.min(STEP);
            let allocated = if x.present { &img1 } else { &img2 };
            first_difference(allocated, None, pos, pos + step)?
        };
        if let Some(at) = difference {
            say(mismatch(at));
            return Ok(Verdict::Different);
        }
        pos += step;
        progress.add(step, total);
    }
    if s1 != s2 {
        say("Warning: Image size mismatch!".into());
        let longer = if s1 > s2 { &img1 } else { &img2 };
        while pos < total {
            let extent = longer.extent_at(pos, total)?;
            let mut step = extent.len;
            if extent.present {
                step = step.min(STEP);
                if let Some(at) = first_difference(longer, None, pos, pos + step)? {
                    say(mismatch(at));
                    return Ok(Verdict::Different);
                }
            }
            pos += step;
            progress.add(step, total);
        }
    }
    say("Images are identical.".into());
    Ok(Verdict::Identical)
}

fn mismatch(offset: u64) -> String {
    format!("Content mismatch at offset {}!", offset / 512 * 512)
}

/// First byte in `start..end` (at most [`STEP`] bytes) where `a` differs
/// from `b` (or from zeroes).
fn first_difference(
    a: &ImageIo,
    b: Option<&ImageIo>,
    start: u64,
    end: u64,
) -> Result<Option<u64>, CliError> {
    let n = (end - start) as usize;
    let read = |img: &ImageIo| {
        img.read_owned(start, vec![0u8; n])
            .map_err(|source| CliError::Read {
                offset: start,
                source,
            })
    };
    let x = read(a)?;
    let y = match b {
        Some(b) => read(b)?,
        None => vec![0u8; n],
    };
    Ok(x.iter()
        .zip(&y)
        .position(|(p, q)| p != q)
        .map(|i| start + i as u64))
}
