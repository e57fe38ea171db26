//! Option values shared by several verbs: `-f` formats, `-o key=value`
//! creation options, and opening an image read-only or read-write.
//!
//! Words from the command line enter; block-crate option structs leave.

use std::path::Path;

use block::create::CreateOptions;
use block::{DiskOptions, ImageType};

use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::size::parse_size;

/// Parses `-f`/`-O`/`-F`: "raw" or "qcow2" (`None`: probe).
pub fn parse_format(value: Option<&str>) -> Result<ImageType, CliError> {
    match value {
        None => Ok(ImageType::Auto),
        Some("raw") => Ok(ImageType::Raw),
        Some("qcow2") => Ok(ImageType::Qcow2),
        Some(other) => Err(CliError::Usage(format!("Unknown file format '{other}'"))),
    }
}

/// Opens an image for a verb; errors name the file like qemu-img does.
pub fn open_image(path: &str, fmt: ImageType, readonly: bool) -> Result<ImageIo, CliError> {
    let mut opts = DiskOptions::new(path);
    opts.readonly = readonly;
    opts.image_type = fmt;
    ImageIo::open(&opts).map_err(|source| CliError::Open {
        path: path.into(),
        source,
    })
}

/// Applies `-o` option strings ("a=1,b=2", possibly repeated) to `opts`.
pub fn apply_create_options(opts: &mut CreateOptions, values: &[&str]) -> Result<(), CliError> {
    for (key, val) in option_items(values) {
        if set_create_option(opts, key, val)? {
            continue;
        }
        return Err(CliError::Usage(format!(
            "Invalid parameter '{key}' (ch-img supports size, cluster_size, backing_file, backing_fmt, compat, refcount_bits, lazy_refcounts, extended_l2, compression_type, preallocation)"
        )));
    }
    Ok(())
}

/// The `key=value` items of `-o` option strings ("a=1,b=2", `-o` may
/// repeat), in command-line order; a bare `key` means `key=on`.
pub fn option_items<'a>(values: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    values
        .iter()
        .flat_map(|value| value.split(','))
        .filter(|item| !item.is_empty())
        .map(|item| item.split_once('=').unwrap_or((item, "on")))
        .collect()
}

/// Sets one image creation option (every one `create` takes);
/// `Ok(false)` when `key` is not one of them.
pub fn set_create_option(opts: &mut CreateOptions, key: &str, val: &str) -> Result<bool, CliError> {
    let bad = || CliError::Usage(format!("Invalid value '{val}' for option '{key}'"));
    match key {
        "size" => opts.size = parse_size(val).ok_or_else(bad)?,
        "preallocation" => opts.preallocation = val.parse().map_err(CliError::Usage)?,
        "cluster_size" => opts.cluster_size = Some(parse_size(val).ok_or_else(bad)?),
        "backing_file" => opts.backing_file = Some(val.to_string()),
        "backing_fmt" => opts.backing_fmt = Some(parse_format(Some(val))?),
        "compat" => opts.compat = Some(val.to_string()),
        "refcount_bits" => opts.refcount_bits = Some(val.parse().map_err(|_| bad())?),
        "lazy_refcounts" => opts.lazy_refcounts = parse_bool(val).ok_or_else(bad)?,
        "extended_l2" => opts.extended_l2 = parse_bool(val).ok_or_else(bad)?,
        "compression_type" => {
            opts.zstd = match val {
                "zlib" => false,
                "zstd" => true,
                _ => return Err(bad()),
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "on" | "true" | "yes" => Some(true),
        "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// Bytes the file occupies on disk (qemu-img's "disk size"/"actual-size").
pub fn allocated_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.blocks() * 512)
}
