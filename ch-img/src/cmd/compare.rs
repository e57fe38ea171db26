//! `ch-img compare [-f fmt] [-F fmt] [-s] [-q] FILE1 FILE2`
//!
//! Reads both images through the block read path in chunks and reports the
//! first difference as qemu-img does ("Content mismatch at offset N!", N
//! rounded down to a 512-byte sector). The longer image's tail must read as
//! zeroes unless `-s` (strict), where a size difference is a mismatch and
//! so is a difference in allocation status (present, zero, data flags of
//! `block_status`).
//! Exit 0 identical, 1 different, 2 error. `-T` is the cache mode both
//! images are read in (default writeback, as qemu-img's).

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::image_io::ImageIo;
use block::options::CacheMode;

use crate::options::{force_share, open_reader, parse_cache, parse_format, CacheFlag};

const SPEC: OptSpec = OptSpec {
    short_with_value: "fFT",
    short_flags: "sqpUh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

const CHUNK: u64 = 1 << 20;

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let [a, b] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting two image file names".into()));
    };
    let quiet = p.flag("q");
    let strict = p.flag("s");
    let cache = parse_cache(p.value("T"), CacheMode::Writeback, CacheFlag::Source)?;
    let shared = force_share(&p);
    let img1 = open_reader(a, parse_format(p.value("f"))?, cache, shared)?;
    let img2 = open_reader(
        b,
        parse_format(p.value("F").or(p.value("f")))?,
        cache,
        shared,
    )?;
    let (s1, s2) = (img1.size(), img2.size());
    if strict && s1 != s2 {
        if !quiet {
            println!("Strict mode: Image size mismatch!");
        }
        return Ok(1);
    }
    let common = s1.min(s2);
    if strict {
        if let Some(off) = first_status_difference(&img1, &img2, common)? {
            if !quiet {
                println!("Strict mode: Offset {off} block status mismatch!");
            }
            return Ok(1);
        }
    }
    if let Some(off) = first_difference(&img1, Some(&img2), common)? {
        report(quiet, off);
        return Ok(1);
    }
    if s1 != s2 {
        let longer = if s1 > s2 { &img1 } else { &img2 };
        if let Some(off) = first_difference_from(longer, None, common, s1.max(s2))? {
            report(quiet, off);
            return Ok(1);
        }
        if !quiet {
            println!("Warning: Image size mismatch!");
        }
    }
    if !quiet {
        println!("Images are identical.");
    }
    Ok(0)
}

fn report(quiet: bool, offset: u64) {
    if !quiet {
        println!("Content mismatch at offset {}!", offset / 512 * 512);
    }
}

/// First offset in `0..end` where the two images' allocation status
/// (present, zero, data) differs.
fn first_status_difference(a: &ImageIo, b: &ImageIo, end: u64) -> Result<Option<u64>, CliError> {
    let mut pos = 0u64;
    while pos < end {
        let (x, y) = (a.extent_at(pos, end)?, b.extent_at(pos, end)?);
        if (x.present, x.zero, x.data) != (y.present, y.zero, y.data) {
            return Ok(Some(pos));
        }
        let step = x.len.min(y.len).min(end - pos);
        if step == 0 {
            return Ok(Some(pos));
        }
        pos += step;
    }
    Ok(None)
}

/// First byte in `0..end` where `a` differs from `b` (or from zeroes).
pub fn first_difference(
    a: &ImageIo,
    b: Option<&ImageIo>,
    end: u64,
) -> Result<Option<u64>, CliError> {
    first_difference_from(a, b, 0, end)
}

fn first_difference_from(
    a: &ImageIo,
    b: Option<&ImageIo>,
    start: u64,
    end: u64,
) -> Result<Option<u64>, CliError> {
    let mut buf_a = vec![0u8; CHUNK as usize];
    let mut buf_b = vec![0u8; CHUNK as usize];
    let mut pos = start;
    while pos < end {
        let n = (end - pos).min(CHUNK) as usize;
        a.read_at(pos, &mut buf_a[..n])
            .map_err(|source| CliError::Read {
                offset: pos,
                source,
            })?;
        match b {
            Some(b) => b
                .read_at(pos, &mut buf_b[..n])
                .map_err(|source| CliError::Read {
                    offset: pos,
                    source,
                })?,
            None => buf_b[..n].fill(0),
        }
        if let Some(i) = buf_a[..n].iter().zip(&buf_b[..n]).position(|(x, y)| x != y) {
            return Ok(Some(pos + i as u64));
        }
        pos += n as u64;
    }
    Ok(None)
}
