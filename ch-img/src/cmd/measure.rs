//! `ch-img measure [--output=human|json] [-O raw|qcow2] [-o OPTIONS]
//! [--size N | [-f FMT] FILE]`
//!
//! Says how many bytes a new image of the output format would take: for
//! a disk of `--size` bytes, or to hold a copy of FILE (what `convert`
//! would write). The output's `-o` options give the qcow2 geometry
//! ([`Geometry`]); FILE's extents come from `block_status` through its
//! whole backing chain, its persistent bitmaps from its `info`; the byte
//! counts come from block's qcow2 layout arithmetic
//! ([`block::formats::qcow2::layout`]). Printed as qemu-img prints them:
//! "required size", "fully allocated size" and, for a qcow2 v3 output
//! measured from a qcow2 v3 image, "bitmaps size" (its persistent
//! bitmaps).

use block::formats::qcow2::layout::{bitmaps_size, Geometry};
use block::formats::ImageInfo;
use block::prealloc::Preallocation;
use block::ImageType;
use serde_json::{json, Map, Value};

use crate::args::{parse, OptSpec, Parsed};
use crate::cmd::{print_json, OutputFormat};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::{force_share, open_reader, option_items, parse_format, set_create_option};
use block::options::CacheMode;
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "fOols",
    short_flags: "U",
    long_with_value: &["output", "size"],
    long_flags: &["force-share"],
};

/// qemu reports sizes of images in whole 512-byte sectors.
const SECTOR: u64 = 512;

/// The `-o` options measure takes for each output format.
const RAW_KEYS: &str = "size, preallocation";
const QCOW2_KEYS: &str = "size, preallocation, cluster_size, compat, refcount_bits, extended_l2, lazy_refcounts, compression_type, backing_file, backing_fmt";

/// `-o preallocation=`: for measure, only whether the new image would
/// have every data cluster allocated (falloc, full).
fn allocates_data(p: Preallocation) -> bool {
    matches!(p, Preallocation::Falloc | Preallocation::Full)
}

/// The output image as the `-o` options describe it.
struct Target {
    /// `-o size=` (overridden by `--size`).
    size: u64,
    preallocation: Preallocation,
    /// `-o backing_file=`: the copy shares nothing known with its backing
    /// file, so every data cluster counts.
    has_backing_file: bool,
    /// qcow2 only (qemu's defaults for another format).
    layout: Geometry,
    /// qcow2 version 3 (compat=1.1).
    v3: bool,
}

/// What qemu-img measure prints.
struct Measurement {
    required: u64,
    fully_allocated: u64,
    bitmaps: Option<u64>,
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let output = OutputFormat::parse(p.value("output"))?;
    // qemu-img takes the snapshot as -l; -s is a likely slip for it.
    if let Some(opt) = ["l", "s"].into_iter().find(|o| p.value(o).is_some()) {
        return Err(CliError::Usage(format!(
            "Measuring an internal snapshot (-{opt}) is not supported"
        )));
    }
    let size = p
        .value("size")
        .map(|v| {
            parse_size(v).ok().ok_or_else(|| {
                CliError::Usage(
                    "Invalid image size specified. You may use k, M, G, T, P or E suffixes for kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.".into(),
                )
            })
        })
        .transpose()?;
    let path = input_path(&p, size.is_some())?;
    let format = match parse_format(p.value("O"))? {
        ImageType::Auto => ImageType::Raw,
        f => f,
    };
    let mut target = Target::parse(format, &p.values("o"))?;
    if let Some(size) = size {
        target.size = size;
    }
    // The image to measure a copy of.
    let input = match path {
        Some(path) => Some(open_reader(
            path,
            parse_format(p.value("f"))?,
            CacheMode::Writeback,
            force_share(&p),
        )?),
        None => None,
    };
    let m = match format {
        ImageType::Qcow2 => measure_qcow2(&target, input.as_ref())?,
        _ => measure_raw(&target, input.as_ref()),
    };
    print_measurement(&m, output)?;
    Ok(0)
}

/// The FILE operand, checked against `--size` and `-f` as qemu-img does.
fn input_path(p: &Parsed, has_size: bool) -> Result<Option<&str>, CliError> {
    let usage = |m: &str| Err(CliError::Usage(m.into()));
    match (p.operands.as_slice(), has_size) {
        ([_, _, ..], _) => usage("At most one filename argument is allowed."),
        ([_], true) => usage("--size N cannot be used together with a filename."),
        ([path], false) => Ok(Some(path.as_str())),
        ([], false) => usage("Either --size N or one filename must be specified."),
        ([], true) if p.value("f").is_some() => usage("-f requires a filename argument."),
        ([], true) => Ok(None),
    }
}

impl Target {
    /// Reads `-o` for an output of `format`, checked as qemu's measure
    /// checks it.
    fn parse(format: ImageType, values: &[&str]) -> Result<Self, CliError> {
        let mut preallocation = Preallocation::Off;
        let mut create = block::create::CreateOptions::default();
        for (key, val) in option_items(values) {
            let known = if key == "preallocation" {
                preallocation = val.parse().map_err(CliError::Usage)?;
                true
            } else if key == "size" || format == ImageType::Qcow2 {
                set_create_option(&mut create, key, val)?
            } else {
                // A raw image has no other creation option.
                false
            };
            if !known {
                let (name, keys) = if format == ImageType::Qcow2 {
                    ("qcow2", QCOW2_KEYS)
                } else {
                    ("raw", RAW_KEYS)
                };
                return Err(CliError::Usage(format!(
                    "Invalid parameter '{key}' for file format '{name}' (ch-img measure supports {keys})"
                )));
            }
        }
        let cluster_size = create.cluster_size.unwrap_or(65536);
        let refcount_bits = u64::from(create.refcount_bits.unwrap_or(16));
        let v3 = match create.compat.as_deref() {
            None | Some("1.1") => true,
            Some("0.10") => false,
            Some(other) => {
                return Err(CliError::Usage(format!(
                    "Invalid compatibility level: '{other}'"
                )))
            }
        };
        let layout = if format == ImageType::Qcow2 {
            check_layout(cluster_size, refcount_bits, create.extended_l2, v3)?;
            Geometry {
                cluster_bits: cluster_size.trailing_zeros(),
                refcount_order: refcount_bits.trailing_zeros(),
                extended_l2: create.extended_l2,
            }
        } else {
            Geometry {
                cluster_bits: 16,
                refcount_order: 4,
                extended_l2: false,
            }
        };
        Ok(Target {
            size: create.size,
            preallocation,
            has_backing_file: create.backing_file.is_some(),
            layout,
            v3,
        })
    }
}

/// qemu's limits on the qcow2 geometry (measure does not check the
/// options that only change feature bits, such as lazy_refcounts with
/// compat=0.10).
fn check_layout(
    cluster_size: u64,
    refcount_bits: u64,
    extended_l2: bool,
    v3: bool,
) -> Result<(), CliError> {
    let usage = |m: &str| Err(CliError::Usage(m.into()));
    if !cluster_size.is_power_of_two() || !(512..=2 << 20).contains(&cluster_size) {
        return usage("Cluster size must be a power of two between 512 and 2048k");
    }
    if extended_l2 && cluster_size < 16384 {
        return usage(
            "Extended L2 entries are only supported with cluster sizes of at least 16384 bytes",
        );
    }
    if !refcount_bits.is_power_of_two() || refcount_bits > 64 {
        return usage("Refcount width must be a power of two and may not exceed 64 bits");
    }
    if !v3 && refcount_bits != 16 {
        return usage("Different refcount widths than 16 bits require compatibility level 1.1 or above (use compat=1.1 or greater)");
    }
    Ok(())
}

/// A raw copy takes the disk's size, rounded up to whole sectors; holes
/// count as they still belong to the file.
fn measure_raw(target: &Target, input: Option<&ImageIo>) -> Measurement {
    let size = input.map_or(target.size, ImageIo::size);
    // Sizes are below 2^63, so rounding up to a sector fits.
    let size = size.next_multiple_of(SECTOR);
    Measurement {
        required: size,
        fully_allocated: size,
        bitmaps: None,
    }
}

fn too_large() -> CliError {
    CliError::Usage("The image size is too large (try using a larger cluster size)".into())
}

/// A qcow2 copy: all metadata of a fully allocated image, plus the data
/// clusters the input needs (or all of them with preallocation=falloc or
/// full, or with a backing file).
fn measure_qcow2(target: &Target, input: Option<&ImageIo>) -> Result<Measurement, CliError> {
    let layout = &target.layout;
    // qemu checks the L1 table for the size option only, not for an input.
    let asked = layout.round_up(target.size).ok_or_else(too_large)?;
    if !layout.l1_fits(asked) {
        return Err(too_large());
    }
    let (virtual_size, mut data) = match input {
        None => (asked, 0),
        Some(image) => {
            let disk = image.size().next_multiple_of(SECTOR);
            let virtual_size = layout.round_up(disk).ok_or_else(too_large)?;
            let data = if target.has_backing_file {
                virtual_size
            } else {
                data_clusters_bytes(image, layout.cluster_size())?
            };
            (virtual_size, data)
        }
    };
    if allocates_data(target.preallocation) {
        data = virtual_size;
    }
    let fully_allocated = layout.fully_allocated(virtual_size).ok_or_else(too_large)?;
    // The open refused a bitmap directory qemu would refuse, so `info`
    // lists every bitmap.
    let bitmaps = match input.map(|image| (image, image.format().info())) {
        Some((image, info)) if target.v3 && is_qcow2_v3(&info) => {
            let disk = image.size().next_multiple_of(SECTOR);
            Some(bitmaps_size(
                info.bitmaps.iter().map(|b| b.shape()),
                disk,
                layout.cluster_size(),
            ))
        }
        _ => None,
    };
    Ok(Measurement {
        required: fully_allocated - virtual_size + data,
        fully_allocated,
        bitmaps,
    })
}

/// Whether the input is a qcow2 v3 image: only those keep persistent
/// bitmaps, so only then does qemu report a bitmaps size.
fn is_qcow2_v3(info: &ImageInfo) -> bool {
    info.format == "qcow2" && info.compat.as_deref() == Some("1.1")
}

/// Bytes of the output clusters (`cluster_size` each) that hold some of
/// the input's data. Ranges reading as zeroes need none: the copy has no
/// backing file, so an unallocated cluster reads as zeroes too.
fn data_clusters_bytes(image: &ImageIo, cluster_size: u64) -> Result<u64, CliError> {
    let size = image.size();
    let mut total = 0;
    let mut pos = 0;
    while pos < size {
        let status = image.extent_at(pos, size)?;
        let end = pos + status.len;
        if status.zero || !(status.data && status.present) {
            pos = end;
            continue;
        }
        // Count every cluster this extent touches; the rest of its last
        // cluster is counted already, so the walk goes on after it.
        let first = pos - pos % cluster_size;
        let last = end.next_multiple_of(cluster_size);
        total += last - first;
        pos = last;
    }
    Ok(total)
}

fn print_measurement(m: &Measurement, output: OutputFormat) -> Result<(), CliError> {
    match output {
        OutputFormat::Human => {
            println!("required size: {}", m.required);
            println!("fully allocated size: {}", m.fully_allocated);
            if let Some(b) = m.bitmaps {
                println!("bitmaps size: {b}");
            }
            Ok(())
        }
        OutputFormat::Json => {
            // qemu-img 7.2 prints "bitmaps" first.
            let mut obj = Map::new();
            if let Some(b) = m.bitmaps {
                obj.insert("bitmaps".into(), json!(b));
            }
            obj.insert("required".into(), json!(m.required));
            obj.insert("fully-allocated".into(), json!(m.fully_allocated));
            print_json(&Value::Object(obj))
        }
    }
}
