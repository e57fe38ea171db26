//! `ch-img info [-f fmt] [--output=human|json] [--backing-chain] [-U] FILE`
//!
//! Opens the image read-only *without* its backing chain (as qemu-img
//! does, so an overlay whose backing file is missing, locked or part of a
//! loop still shows, with its `backing file:` line), takes
//! [`block::formats::ImageInfo`] and the file's allocated size, and
//! prints them as qemu-img does (human text, or JSON with qemu-img's key
//! names and order). With `--backing-chain` it does the same for every
//! backing image in turn (opened by its full backing file name and
//! `backing_fmt`, also without its chain): human reports separated by a
//! blank line, or a JSON list. As in qemu-img, the whole chain is opened
//! before anything is printed, so a chain that breaks (a missing file, a
//! loop) prints only the error. An NBD URI, in any spelling, is named as
//! qemu-img names it (`nbd://HOST:PORT/NAME`, `nbd+unix://?socket=PATH`
//! for the default export), without a dirty flag or disk size.

use std::collections::HashSet;

use block::formats::{BitmapEntry, ImageInfo};
use block::info_json::{data_file_raw, json_info};
use block::options::CacheMode;
use block::{DiskOptions, ImageType};
use serde_json::Value;

use crate::args::{parse, OptSpec};
use crate::cmd::snapshot::snapshot_list;
use crate::cmd::{print_json, OutputFormat};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::{force_share, open_error, parse_format};
use crate::size::human_size;

/// Most images `--backing-chain` follows (a chain of distinct files
/// longer than this is refused rather than followed).
const MAX_CHAIN: usize = 1024;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "f",
    short_flags: "Uqh",
    long_with_value: &["output"],
    long_flags: &["force-share", "backing-chain"],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let output = OutputFormat::parse(p.value("output"))?;
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let chain = p.flag("backing-chain");
    let shared = force_share(&p);
    let mut layers: Vec<(String, ImageInfo, Option<u64>)> = Vec::new();
    let mut seen = HashSet::new();
    let mut next = Some((path.clone(), parse_format(p.value("f"))?));
    while let Some((path, format)) = next.take() {
        let image = open_layer(&path, format, shared)?;
        // A file met twice: the chain loops (qemu-img's words).
        let ids = image.file_identities();
        let met_before = ids.iter().filter(|id| !seen.insert(**id)).count();
        if met_before > 0 {
            return Err(CliError::Usage(format!(
                "Backing file '{path}' creates an infinite loop."
            )));
        }
        let info = image.format().info();
        drop(image);
        let actual = block::info_json::allocated_bytes(path.as_ref());
        if chain {
            if let Some(backing) = &info.full_backing_filename {
                if layers.len() >= MAX_CHAIN {
                    return Err(CliError::Usage(format!(
                        "backing chain of '{}' is longer than {MAX_CHAIN} images",
                        layers[0].0
                    )));
                }
                let fmt = parse_format(info.backing_filename_format.as_deref())?;
                next = Some((backing.clone(), fmt));
            }
        }
        layers.push((path, info, actual));
    }
    match output {
        OutputFormat::Json if chain => print_json(&Value::Array(
            layers
                .iter()
                .map(|(path, info, actual)| json_info(path, info, *actual))
                .collect(),
        ))?,
        OutputFormat::Json => {
            let (path, info, actual) = &layers[0];
            print_json(&json_info(path, info, *actual))?
        }
        OutputFormat::Human => {
            let reports: Vec<String> = layers
                .iter()
                .map(|(path, info, actual)| human_info(path, info, *actual))
                .collect();
            print!("{}", reports.join("\n"));
        }
    }
    Ok(0)
}

/// Opens one image of the chain read-only, without its backing files.
fn open_layer(path: &str, format: ImageType, force_share: bool) -> Result<ImageIo, CliError> {
    let mut opts = DiskOptions::new(path);
    opts.readonly = true;
    opts.no_backing = true;
    opts.force_share = force_share;
    opts.image_type = format;
    ImageIo::open(&opts, CacheMode::Writeback)
        .map_err(|source| open_error(path, CacheMode::Writeback, source))
}

/// qemu-img's human-readable report (an NBD URI named as QEMU names
/// the export, [`block::engines::nbd::qemu_filename`]).
pub fn human_info(path: &str, info: &ImageInfo, actual: Option<u64>) -> String {
    let mut s = format!(
        "image: {}\nfile format: {}\nvirtual size: {} ({} bytes)\ndisk size: {}\n",
        block::engines::nbd::qemu_filename(path),
        info.format,
        human_size(info.virtual_size),
        info.virtual_size,
        actual
            .map(human_size)
            .unwrap_or_else(|| "unavailable".into()),
    );
    if let Some(c) = info.cluster_size {
        s.push_str(&format!("cluster_size: {c}\n"));
    }
    if info.dirty == Some(true) {
        s.push_str("cleanly shut down: no\n");
    }
    if let Some(b) = &info.backing_filename {
        match &info.full_backing_filename {
            Some(full) if full != b => {
                s.push_str(&format!("backing file: {b} (actual path: {full})\n"))
            }
            _ => s.push_str(&format!("backing file: {b}\n")),
        }
        if let Some(f) = &info.backing_filename_format {
            s.push_str(&format!("backing file format: {f}\n"));
        }
    }
    if !info.snapshots.is_empty() {
        s.push_str(&snapshot_list(&info.snapshots));
    }
    if info.format == "qcow2" {
        s.push_str("Format specific information:\n");
        let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("    {k}: {v}\n"));
        if let Some(c) = &info.compat {
            line(&mut s, "compat", c.clone());
        }
        if let Some(c) = info.compression_type {
            line(&mut s, "compression type", c.to_string());
        }
        let v3 = info.compat.as_deref() != Some("0.10");
        if v3 {
            if let Some(l) = info.lazy_refcounts {
                line(&mut s, "lazy refcounts", l.to_string());
            }
            if !info.bitmaps.is_empty() {
                s.push_str(&bitmap_list(&info.bitmaps));
            }
        }
        if let Some(r) = info.refcount_bits {
            line(&mut s, "refcount bits", r.to_string());
        }
        if let Some(d) = &info.data_file {
            line(&mut s, "data file", d.clone());
            line(&mut s, "data file raw", data_file_raw(path).to_string());
        }
        if v3 {
            if let Some(c) = info.corrupt {
                line(&mut s, "corrupt", c.to_string());
            }
        }
        if v3 {
            if let Some(e) = info.extended_l2 {
                line(&mut s, "extended l2", e.to_string());
            }
        }
    }
    s
}

/// The "bitmaps:" block of the human report, indented under "Format
/// specific information".
fn bitmap_list(bitmaps: &[BitmapEntry]) -> String {
    let mut s = String::from("    bitmaps:\n");
    for (i, b) in bitmaps.iter().enumerate() {
        s.push_str(&format!("        [{i}]:\n            flags:\n"));
        for (j, flag) in b.flag_names().iter().enumerate() {
            s.push_str(&format!("                [{j}]: {flag}\n"));
        }
        let granularity = 1u64.checked_shl(u32::from(b.granularity_bits)).unwrap_or(0);
        s.push_str(&format!(
            "            name: {}\n            granularity: {granularity}\n",
            b.name
        ));
    }
    s
}
