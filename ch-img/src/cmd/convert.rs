//! `ch-img convert [-c] [-f fmt] [-O raw|qcow2] [-o opts] [-q] [-p]
//! [-S size] [-t cache] [-T src_cache] [-m N] [-W] SRC DST`
//!
//! Creates the output, then copies the source into it
//! ([`crate::copy_pipeline`]): `-m` workers (1..16, default 8) read the
//! source through the block read path and, with `-c`, compress; ranges
//! that read as zeroes are skipped, and so are zero blocks (4 KiB, or
//! `-S`) inside data, so the output stays sparse. With `-c` (qcow2 only)
//! every cluster with data is written compressed, or normally when
//! compression does not shrink it; the last cluster is zero-padded, as
//! qemu-img does. The output is written in disk order (a `-c` output is
//! laid out as a serial run's) unless `-W`; qemu-img 7.2 accepts `-W` with
//! `-c`, and so does ch-img, but compressed clusters are still written in
//! order.
//!
//! `-t` is the output's cache mode (default `unsafe`, as qemu-img's: no
//! flushes), `-T` the source's (default `writeback`). With `none` or
//! `directsync` the output is written with O_DIRECT, compressed clusters
//! through the block crate's compressed-cluster write cache
//! (`--compressed-cache=N`, a ch-img extension: host clusters it holds,
//! default 64, 0 for none).
//!
//! When a write fails (ENOSPC...), the error names the output and the
//! partial output is left in place, as qemu-img leaves it.

use std::fs::OpenOptions;

use block::create::{create_image, CreateOptions};
use block::formats::Compression;
use block::options::CacheMode;
use block::prealloc::{preallocate_range, Preallocation};
use block::ImageType;

use crate::args::{parse, OptSpec};
use crate::copy_pipeline::{self, Job, Mode};
use crate::error::CliError;
use crate::options::{
    apply_create_options, open_image_cached, option_items, parse_cache, parse_format, CacheFlag,
};
use crate::progress::Progress;
use crate::size::parse_size;

const SPEC: OptSpec = OptSpec {
    short_with_value: "fOoStTBm",
    short_flags: "qpnUcWh",
    long_with_value: &["compressed-cache"],
    long_flags: &["force-share"],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let compress = p.flag("c");
    if p.value("B").is_some() || p.flag("n") {
        return Err(CliError::Usage(
            "ch-img convert supports neither -B nor -n".into(),
        ));
    }
    let workers = parse_workers(p.value("m"))?;
    let dst_cache = parse_cache(p.value("t"), CacheMode::Unsafe, CacheFlag::Target)?;
    let src_cache = parse_cache(p.value("T"), CacheMode::Writeback, CacheFlag::Source)?;
    let [src, dst] = p.operands.as_slice() else {
        return Err(CliError::Usage(
            "Expecting one source and one destination file name".into(),
        ));
    };
    let block = match p.value("S") {
        Some(s) => parse_size(s).filter(|&b| b % 512 == 0).ok_or_else(|| {
            CliError::Usage("Invalid buffer size for sparse output specified".into())
        })?,
        None => 4096,
    };
    let out_fmt = match parse_format(p.value("O"))? {
        ImageType::Auto => ImageType::Raw,
        f => f,
    };
    if compress && out_fmt != ImageType::Qcow2 {
        return Err(CliError::Usage(
            "Compression not supported for this file format".into(),
        ));
    }
    if block::nbd::is_nbd_path(std::path::Path::new(dst)) {
        return Err(CliError::Usage(format!(
            "ch-img convert cannot write to an NBD export ({dst}): that needs -n, which ch-img does not support"
        )));
    }
    let src_fmt = parse_format(p.value("f"))?;
    let size = open_image_cached(src, src_fmt, true, src_cache)?.size();
    create_output(dst, out_fmt, size, &p.values("o"), compress)?;
    let output = open_image_cached(dst, out_fmt, false, dst_cache)?;
    if let Some(n) = p.value("compressed-cache") {
        let n = n.parse().map_err(|_| {
            CliError::Usage(format!(
                "Invalid --compressed-cache value '{n}' (host clusters)"
            ))
        })?;
        output.tools().set_compressed_cache(n);
    }
    let mode = if compress {
        Mode::Compressed {
            cluster_size: output.format().info().cluster_size.unwrap_or(65536),
            algorithm: output.tools().compression().unwrap_or(Compression::Deflate),
        }
    } else {
        Mode::Sparse { block }
    };
    let open_source = || open_image_cached(src, src_fmt, true, src_cache);
    let job = Job {
        open_source: &open_source,
        output: &output,
        output_path: dst,
        size,
        mode,
        workers,
        in_order: compress || !p.flag("W"),
    };
    let mut progress = Progress::new(p.flag("p") && !p.flag("q"), size);
    copy_pipeline::run(&job, &mut progress)?;
    output.close().map_err(|source| CliError::WriteOutput {
        path: dst.into(),
        offset: size,
        source,
    })?;
    drop(output);
    if out_fmt == ImageType::Raw {
        // O_DIRECT pads the last partial block of the disk: cut the file
        // back to the disk's size.
        OpenOptions::new()
            .write(true)
            .open(dst)
            .and_then(|f| f.set_len(size))
            .map_err(|source| CliError::OutputFile {
                path: dst.into(),
                source,
            })?;
    }
    progress.finish();
    Ok(0)
}

/// `-m`: 1..16 workers, 8 by default, refused as qemu-img refuses it.
fn parse_workers(value: Option<&str>) -> Result<usize, CliError> {
    const REFUSED: &str =
        "Invalid number of coroutines. Allowed number of coroutines is between 1 and 16";
    match value {
        None => Ok(8),
        Some(m) => m
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=16).contains(n))
            .ok_or_else(|| CliError::Usage(REFUSED.into())),
    }
}

/// Creates the output image: a qcow2 with the `-o` options, or a raw file
/// of the source's size (sparse, or preallocated with `-o
/// preallocation=falloc|full`). Preallocation with `-c` is refused, as
/// qemu-img refuses it; a preallocation that fails removes the file.
fn create_output(
    dst: &str,
    fmt: ImageType,
    size: u64,
    o: &[&str],
    compress: bool,
) -> Result<(), CliError> {
    let create_error = |source| CliError::Create {
        path: dst.into(),
        source,
    };
    if fmt == ImageType::Qcow2 {
        let mut opts = CreateOptions {
            format: ImageType::Qcow2,
            size,
            ..Default::default()
        };
        apply_create_options(&mut opts, o)?;
        refuse_compressed_preallocation(compress, opts.preallocation)?;
        opts.path = dst.into();
        opts.size = size;
        return create_image(&opts).map_err(create_error);
    }
    let mut preallocation = Preallocation::Off;
    for (key, val) in option_items(o) {
        if key != "preallocation" {
            return Err(CliError::Usage(
                "raw output takes no -o options but preallocation".into(),
            ));
        }
        preallocation = val.parse().map_err(CliError::Usage)?;
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .and_then(|f| f.set_len(size).map(|()| f))
        .map_err(|source| CliError::OutputFile {
            path: dst.into(),
            source,
        })?;
    if preallocation != Preallocation::Off {
        let path = std::path::Path::new(dst);
        preallocate_raw(&f, path, preallocation, size).map_err(|source| {
            let _ = std::fs::remove_file(path);
            create_error(source)
        })?;
    }
    Ok(())
}

/// qemu-img convert refuses `-c` with any preallocation but off.
fn refuse_compressed_preallocation(compress: bool, p: Preallocation) -> Result<(), CliError> {
    if compress && p != Preallocation::Off {
        return Err(CliError::Usage(
            "Compression and preallocation not supported at the same time".into(),
        ));
    }
    Ok(())
}

/// Preallocates a raw output: `falloc` or `full` (`metadata` is qcow2's).
fn preallocate_raw(
    f: &std::fs::File,
    path: &std::path::Path,
    p: Preallocation,
    size: u64,
) -> Result<(), block::BlockError> {
    if p == Preallocation::Metadata {
        return Err(block::BlockError::InvalidImage {
            path: path.into(),
            reason:
                "option preallocation: metadata is for qcow2; raw images take off, falloc or full"
                    .into(),
        });
    }
    preallocate_range(f, path, p, 0, size)
}
