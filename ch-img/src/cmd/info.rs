//! `ch-img info [-f fmt] [--output=human|json] [--backing-chain] [-U] FILE`
//!
//! Opens the image read-only, takes [`block::formats::ImageInfo`] and the
//! file's allocated size, and prints them as qemu-img does (human text, or
//! JSON with qemu-img's key names and order). With `--backing-chain` it
//! does the same for every backing image in turn (opened by its full
//! backing file name and `backing_fmt`): human reports separated by a
//! blank line, or a JSON list.

use block::formats::qcow2::bitmap_directory::BitmapEntry;
use block::formats::ImageInfo;
use block::info_json::{data_file_raw, json_info};
use serde_json::Value;

use crate::args::{parse, OptSpec};
use crate::cmd::snapshot::snapshot_list;
use crate::cmd::{print_json, OutputFormat};
use crate::error::CliError;
use crate::options::{open_image, parse_format};
use crate::size::human_size;

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
    let mut layers = Vec::new();
    let mut next = Some((path.clone(), parse_format(p.value("f"))?));
    while let Some((path, format)) = next.take() {
        let image = open_image(&path, format, true)?;
        let info = image.format().info();
        let actual = block::info_json::allocated_bytes(path.as_ref());
        if chain {
            if let Some(backing) = &info.full_backing_filename {
                // Opening the top image already bounded the chain's depth
                // and refused cycles.
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

/// qemu-img's human-readable report.
pub fn human_info(path: &str, info: &ImageInfo, actual: Option<u64>) -> String {
    let mut s = format!(
        "image: {path}\nfile format: {}\nvirtual size: {} ({} bytes)\ndisk size: {}\n",
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
