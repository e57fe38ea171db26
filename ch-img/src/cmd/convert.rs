//! `ch-img convert [-c] [-f fmt] [-O raw|qcow2] [-o opts] [-B backing [-F
//! backing_fmt]] [-n] [-l snapshot] [-q] [-p] [-S size] [-t cache] [-T
//! src_cache] [-m N] [-W] [-U] SRC [SRC2...] DST`
//!
//! Opens the sources (several are read one after another as one disk;
//! `-l` reads an internal snapshot of a single source) and keeps them
//! open, locked as a reader, while it creates the output (unless `-n`,
//! which writes into an existing image): the output is locked like a
//! writer before it is truncated, and refused when it is one of the files
//! the sources read (by device and inode: the same path, `./X`, a link,
//! a backing file), so a mistake never truncates a source. Then it copies
//! the source into it ([`crate::copy_pipeline`]): `-m` workers (1..16,
//! default 8) read the source through the block read path and, with
//! `-c`, compress; ranges that read as zeroes are skipped, and so are
//! zero blocks (4 KiB, or `-S`) inside data, so the output stays sparse.
//! With `-c` (qcow2 only) every cluster with data is written compressed,
//! or normally when compression does not shrink it; the last cluster is
//! zero-padded, as qemu-img does. The output is written in disk order (a
//! `-c` output is laid out as a serial run's) unless `-W`; qemu-img 7.2
//! accepts `-W` with `-c`, and so does ch-img, but compressed clusters
//! are still written in order.
//!
//! With a backing file for the output (`-B`, or `-o backing_file=`; its
//! format must be given, `-F` or `-o backing_fmt=`) only what the
//! source's top image allocates is written, as qemu-img does; with `-n`
//! or a backing file, ranges that read as zeroes are written as zeroes
//! ([`crate::chunk_fill`]).
//!
//! `-t` is the output's cache mode (default `unsafe`, as qemu-img's: no
//! flushes), `-T` the source's (default `writeback`). With `none` or
//! `directsync` the output is written with O_DIRECT, compressed clusters
//! through the block crate's compressed-cluster write cache
//! (`--compressed-cache=N`, a ch-img extension: host clusters it holds,
//! default 64, 0 for none).
//!
//! When a write fails (ENOSPC...), the error names the output and the
//! partial output is left in place, as qemu-img leaves it. Guest bytes a
//! damaged source puts past the end of its file are converted as zeroes
//! and named on stderr, and the exit status stays 0, as qemu-img 7.2
//! converts such images ([`crate::convert_source`]); other damage fails
//! the copy.

use std::fs::OpenOptions;

use block::create::{create_image, CreateOptions, FileIdentity};
use block::formats::{Compression, SnapshotRef};
use block::options::CacheMode;
use block::prealloc::Preallocation;
use block::ImageType;

use crate::args::{parse, OptSpec, Parsed};
use crate::chunk_fill::Fill;
use crate::convert_source::{ConvertSource, SourceSpec};
use crate::copy_pipeline::{self, Job, Mode};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::option_help::{create_help, wants_help};
use crate::options::{
    apply_create_options, driver_of, force_share, open_image_cached, option_items, parse_cache,
    parse_format, set_create_option, CacheFlag,
};
use crate::progress::Progress;
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "fOoStTBFml",
    short_flags: "qpnUcWh",
    long_with_value: &["compressed-cache"],
    long_flags: &["force-share"],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    if wants_help(&p.values("o")) {
        let format = parse_format(p.value("O"))?;
        print!("{}", create_help(driver_of(format), p.operands.len() >= 2));
        return Ok(0);
    }
    let compress = p.flag("c");
    let skip_create = p.flag("n");
    let workers = parse_workers(p.value("m"))?;
    let dst_cache = parse_cache(p.value("t"), CacheMode::Unsafe, CacheFlag::Target)?;
    let src_cache = parse_cache(p.value("T"), CacheMode::Writeback, CacheFlag::Source)?;
    let Some((dst, sources)) = p.operands.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err(CliError::Usage("Must specify image file name".into()));
    };
    let block = match p.value("S") {
        Some(s) => parse_size(s)
            .ok()
            .filter(|&b| b % 512 == 0)
            .ok_or_else(|| {
                CliError::Usage("Invalid buffer size for sparse output specified".into())
            })?,
        None => 4096,
    };
    let out_fmt = match parse_format(p.value("O"))? {
        ImageType::Auto => ImageType::RAW,
        f => f,
    };
    if compress && !driver_of(out_fmt).compressed_clusters {
        return Err(CliError::Usage(
            "Compression not supported for this file format".into(),
        ));
    }
    // Created on an export (as `create` does: the export keeps its size,
    // its first sector is zeroed), an output does not read as zeroes.
    let nbd_output = block::engines::nbd::is_nbd_path(std::path::Path::new(dst));
    let snapshot = parse_snapshot(p.value("l"));
    if snapshot.is_some() && sources.len() > 1 {
        return Err(CliError::Usage(
            "No support for concatenating multiple snapshot".into(),
        ));
    }
    let o = p.values("o");
    if skip_create && !o.is_empty() {
        return Err(CliError::Usage(
            "-o has no effect when skipping image creation".into(),
        ));
    }
    let backing = output_backing(&p, out_fmt, &o)?;
    let spec = SourceSpec {
        paths: sources.to_vec(),
        format: parse_format(p.value("f"))?,
        cache: src_cache,
        force_share: force_share(&p),
        snapshot,
    };
    // Held (with its reader locks) until the copy ends: a source cannot
    // become the output meanwhile.
    let source = ConvertSource::open(&spec)?;
    let size = source.size();
    let identities = source.identities();
    if !skip_create {
        let output = NewOutput {
            path: dst,
            format: out_fmt,
            size,
            options: &o,
            compress,
            backing: backing.clone(),
        };
        output.create(identities.clone())?;
    }
    let output = open_image_cached(dst, out_fmt, false, dst_cache)?;
    if skip_create {
        refuse_a_source(dst, &output, &identities)?;
        if output.size() < size {
            return Err(CliError::Usage(
                "output file is smaller than input file".into(),
            ));
        }
    }
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
    let fill = Fill {
        zeroes: skip_create || nbd_output || backing.is_some(),
        // Without an opened backing file nothing is past its end.
        backing: backing
            .as_ref()
            .map(|_| output.tools().backing_size().unwrap_or(u64::MAX)),
    };
    // An NBD source has no local file the output could be, and its server
    // may serve one client at a time (qemu-nbd's default): the workers'
    // connections must not wait behind the one held here.
    let nbd_source = spec
        .paths
        .iter()
        .any(|p| block::engines::nbd::is_nbd_path(std::path::Path::new(p)));
    let held = if nbd_source {
        drop(source);
        None
    } else {
        Some(source)
    };
    let open_source = || ConvertSource::open(&spec);
    let job = Job {
        open_source: &open_source,
        output: &output,
        output_path: dst,
        size,
        mode,
        fill,
        workers,
        in_order: compress || !p.flag("W"),
        // Each block status of an NBD export is a round trip.
        extent_bounds: !nbd_source,
    };
    let mut progress = Progress::new(p.flag("p") && !p.flag("q"), size);
    copy_pipeline::run(&job, &mut progress)?;
    output.close().map_err(|source| CliError::WriteOutput {
        path: dst.into(),
        offset: size,
        source,
    })?;
    drop(output);
    drop(held);
    if out_fmt == ImageType::RAW && !skip_create && !nbd_output {
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

/// `-l`: `snapshot.id=ID[,snapshot.name=NAME]` (either field), or a
/// snapshot id or name.
fn parse_snapshot(value: Option<&str>) -> Option<SnapshotRef> {
    let value = value?;
    if !value.starts_with("snapshot.") {
        return Some(SnapshotRef::IdOrName(value.to_string()));
    }
    let (mut id, mut name) = (None, None);
    for (key, val) in option_items(&[value]) {
        match key {
            "snapshot.id" => id = Some(val.to_string()),
            "snapshot.name" => name = Some(val.to_string()),
            _ => {}
        }
    }
    Some(SnapshotRef::Fields { id, name })
}

/// The output's backing file and its format, from `-B`/`-F` or `-o
/// backing_file=`/`backing_fmt=` (`-B` wins), refused as qemu-img
/// refuses it: not for a raw output, not without a format.
fn output_backing(
    p: &Parsed,
    out_fmt: ImageType,
    o: &[&str],
) -> Result<Option<(String, ImageType)>, CliError> {
    let mut name = p.value("B").map(String::from);
    let mut fmt = p.value("F").map(String::from);
    for (key, val) in option_items(o) {
        match key {
            "backing_file" if name.is_none() => name = Some(val.to_string()),
            "backing_fmt" if fmt.is_none() => fmt = Some(val.to_string()),
            _ => {}
        }
    }
    let Some(name) = name else {
        return Ok(None);
    };
    let format = driver_of(out_fmt);
    if !format.backing_files {
        return Err(CliError::Usage(format!(
            "Backing file not supported for file format '{}'",
            format.name
        )));
    }
    let Some(fmt) = fmt else {
        return Err(CliError::Usage(
            "Use of backing file requires explicit backing format".into(),
        ));
    };
    Ok(Some((name, parse_format(Some(&fmt))?)))
}

/// With `-n`: the existing output must not be one of the files the
/// sources read (`-U` lets the open pass the locks).
fn refuse_a_source(dst: &str, output: &ImageIo, sources: &[FileIdentity]) -> Result<(), CliError> {
    let own = output
        .format()
        .files()
        .local()
        .first()
        .map(|f| FileIdentity::of(f));
    match own {
        Some(Ok(id)) if sources.contains(&id) => Err(CliError::Create {
            path: dst.into(),
            source: block::BlockError::OverwritesSource { path: dst.into() },
        }),
        _ => Ok(()),
    }
}

/// The output `convert` creates.
struct NewOutput<'a> {
    path: &'a str,
    format: ImageType,
    size: u64,
    /// `-o` option strings.
    options: &'a [&'a str],
    compress: bool,
    /// The backing file and its format (see [`output_backing`]).
    backing: Option<(String, ImageType)>,
}

impl NewOutput<'_> {
    /// Creates the output: an image with the `-o` options and the backing
    /// file (qcow2), or, for a format with no options of its own (raw), a
    /// file of the source's size (sparse, or preallocated with `-o
    /// preallocation=falloc|full`). It must not be
    /// one of `sources`; it is locked before it is truncated
    /// ([`block::create`]). Preallocation with `-c` is refused, as
    /// qemu-img refuses it; a preallocation that fails removes the file.
    fn create(&self, sources: Vec<FileIdentity>) -> Result<(), CliError> {
        let mut opts = CreateOptions {
            format: self.format,
            size: self.size,
            ..Default::default()
        };
        let format = driver_of(self.format);
        if format.has_own_create_options() {
            apply_create_options(&mut opts, self.options)?;
            if let Some((name, fmt)) = &self.backing {
                opts.backing_file = Some(name.clone());
                opts.backing_fmt = Some(*fmt);
            }
        } else {
            // Only the file protocol's options: the size is the source's.
            let file_options: Vec<&str> = (format.create_options_with_file.iter())
                .map(|o| o.name)
                .filter(|name| *name != "size")
                .collect();
            for (key, val) in option_items(self.options) {
                if !file_options.contains(&key) {
                    return Err(CliError::Usage(format!(
                        "{} output takes no -o options but {}",
                        format.name,
                        file_options.join(", ")
                    )));
                }
                set_create_option(&mut opts, key, val)?;
            }
        }
        if self.compress && opts.preallocation != Preallocation::Off {
            return Err(CliError::Usage(
                "Compression and preallocation not supported at the same time".into(),
            ));
        }
        opts.path = self.path.into();
        opts.size = self.size;
        opts.sources = sources;
        create_image(&opts).map_err(|source| CliError::ConvertCreate {
            path: self.path.into(),
            format: format.name,
            source,
        })
    }
}
