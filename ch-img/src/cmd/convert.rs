//! `ch-img convert [-c] [-f fmt] [-O raw|qcow2] [-o opts] [-q] [-p] [-S size] SRC DST`
//!
//! Reads the source through the block read path, extent by extent as
//! `block_status` reports them. Extents that read as zeroes are skipped,
//! and so are zero blocks (4 KiB granularity, or `-S`) inside data
//! extents, so the output stays sparse: a raw output is a sparse file, a
//! qcow2 output allocates only clusters with data.
//!
//! With `-c` (qcow2 output only) the copy goes cluster by cluster instead:
//! clusters that read as zeroes stay unallocated, the others are written
//! compressed (`Format::write_compressed`), or normally when compression
//! does not shrink them; the last cluster is zero-padded, as qemu-img
//! does.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use block::create::{create_image, CreateOptions};
use block::ImageType;

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::{apply_create_options, open_image, option_items, parse_format};
use crate::size::parse_size;
use block::prealloc::{preallocate_range, Preallocation};

const SPEC: OptSpec = OptSpec {
    short_with_value: "fOoStTB",
    short_flags: "qpnUcWh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

const CHUNK: u64 = 2 << 20;

/// Where converted data goes.
enum Output {
    Raw(std::fs::File),
    Image(Box<ImageIo>),
}

impl Output {
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), CliError> {
        match self {
            Output::Raw(f) => f.write_all_at(data, offset).map_err(|source| CliError::Os {
                what: "write the raw output",
                source,
            }),
            Output::Image(img) => img
                .write_at(offset, data)
                .map_err(|source| CliError::Write { offset, source }),
        }
    }

    fn finish(self) -> Result<(), CliError> {
        match self {
            Output::Raw(f) => f.sync_all().map_err(|source| CliError::Os {
                what: "sync the raw output",
                source,
            }),
            Output::Image(img) => img.close().map_err(CliError::Close),
        }
    }
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let compress = p.flag("c");
    if p.value("B").is_some() || p.flag("n") {
        return Err(CliError::Usage(
            "ch-img convert supports neither -B nor -n".into(),
        ));
    }
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
    let input = open_image(src, parse_format(p.value("f"))?, true)?;
    let size = input.size();
    let output = match out_fmt {
        ImageType::Qcow2 => {
            let mut opts = CreateOptions {
                format: ImageType::Qcow2,
                size,
                ..Default::default()
            };
            apply_create_options(&mut opts, &p.values("o"))?;
            refuse_compressed_preallocation(compress, opts.preallocation)?;
            opts.path = dst.into();
            opts.size = size;
            create_image(&opts).map_err(|source| CliError::Create {
                path: dst.into(),
                source,
            })?;
            Output::Image(Box::new(open_image(dst, ImageType::Qcow2, false)?))
        }
        _ => {
            let mut preallocation = Preallocation::Off;
            for (key, val) in option_items(&p.values("o")) {
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
                .map_err(|source| CliError::OutputFile {
                    path: dst.into(),
                    source,
                })?;
            f.set_len(size).map_err(|source| CliError::OutputFile {
                path: dst.into(),
                source,
            })?;
            if preallocation != Preallocation::Off {
                let dst_path = std::path::Path::new(dst);
                preallocate_raw(&f, dst_path, preallocation, size).map_err(|source| {
                    let _ = std::fs::remove_file(dst_path);
                    CliError::Create {
                        path: dst.into(),
                        source,
                    }
                })?;
            }
            Output::Raw(f)
        }
    };
    match (&output, compress) {
        (Output::Image(img), true) => copy_compressed(&input, img, size)?,
        _ => copy(&input, &output, size, block)?,
    }
    output.finish()?;
    Ok(0)
}

fn copy(input: &ImageIo, output: &Output, size: u64, block: u64) -> Result<(), CliError> {
    let mut buf = vec![0u8; CHUNK as usize];
    let mut pos = 0u64;
    while pos < size {
        let status = input.extent_at(pos, size)?;
        let len = status.len;
        if !status.zero {
            copy_extent(input, output, pos, len, block, &mut buf)?;
        }
        pos += len;
    }
    Ok(())
}

/// Copies `pos..pos+len`, writing only runs of blocks that are not all zero.
fn copy_extent(
    input: &ImageIo,
    output: &Output,
    pos: u64,
    len: u64,
    block: u64,
    buf: &mut [u8],
) -> Result<(), CliError> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK) as usize;
        let at = pos + done;
        input
            .read_at(at, &mut buf[..n])
            .map_err(|source| CliError::Read { offset: at, source })?;
        let mut i = 0usize;
        while i < n {
            // Blocks are aligned to the virtual disk, not to this chunk.
            let b_end = (((at + i as u64) / block + 1) * block - at) as usize;
            let end = b_end.min(n);
            if buf[i..end].iter().all(|&b| b == 0) {
                i = end;
                continue;
            }
            // Extend the run over following non-zero blocks.
            let mut run_end = end;
            while run_end < n {
                let next = (run_end + block as usize).min(n);
                if buf[run_end..next].iter().all(|&b| b == 0) {
                    break;
                }
                run_end = next;
            }
            output.write_at(at + i as u64, &buf[i..run_end])?;
            i = run_end;
        }
        done += n as u64;
    }
    Ok(())
}

/// `-c`: copies cluster by cluster, compressed where that shrinks the
/// cluster (see the module docs).
fn copy_compressed(input: &ImageIo, output: &ImageIo, size: u64) -> Result<(), CliError> {
    let cs = output.format().info().cluster_size.unwrap_or(65536);
    let mut buf = vec![0u8; cs as usize];
    let mut pos = 0u64;
    while pos < size {
        let n = (size - pos).min(cs);
        let status = input.extent_at(pos, pos + n)?;
        if status.zero && status.len >= n {
            pos += n;
            continue;
        }
        buf.fill(0);
        input
            .read_at(pos, &mut buf[..n as usize])
            .map_err(|source| CliError::Read {
                offset: pos,
                source,
            })?;
        if buf.iter().all(|&b| b == 0) {
            pos += n;
            continue;
        }
        let written = output
            .format()
            .write_compressed(pos, &buf)
            .map_err(|source| CliError::Write {
                offset: pos,
                source,
            })?;
        if !written {
            output
                .write_at(pos, &buf[..n as usize])
                .map_err(|source| CliError::Write {
                    offset: pos,
                    source,
                })?;
        }
        pos += n;
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

/// `-o preallocation=falloc|full` for a raw output (metadata is qcow2's).
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
