//! `ch-img measure [--output=human|json] [-O raw|qcow2] [-o OPTIONS]
//! [--size N | [-f FMT] FILE]`
//!
//! Says how many bytes a new image of the output format would take: for
//! a disk of `--size` bytes, or to hold a copy of FILE (what `convert`
//! would write). The output's `-o` options (those its format takes at
//! creation) are checked and measured by the format's driver
//! ([`block::formats::FormatDriver::measure`]): qcow2's from its layout
//! arithmetic, FILE's extents from `block_status` through its whole
//! backing chain and its persistent bitmaps from its `info`. Printed as
//! qemu-img prints them: "required size", "fully allocated size" and,
//! for a qcow2 v3 output measured from a qcow2 v3 image, "bitmaps size"
//! (its persistent bitmaps).

use block::create::CreateOptions;
use block::formats::{MeasureError, Measurement};
use serde_json::{json, Map, Value};

use crate::args::{parse, OptSpec, Parsed};
use crate::cmd::{print_json, OutputFormat};
use crate::error::CliError;
use crate::options::{
    driver_of, force_share, open_reader, option_items, parse_format, set_create_option,
};
use block::options::CacheMode;
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "fOols",
    short_flags: "U",
    long_with_value: &["output", "size"],
    long_flags: &["force-share"],
};

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
    let format = driver_of(parse_format(p.value("O"))?);
    let mut create = CreateOptions::default();
    for (key, val) in option_items(&p.values("o")) {
        if !format.takes_create_option(key) || !set_create_option(&mut create, key, val)? {
            let keys: Vec<&str> = (format.create_options_with_file.iter())
                .map(|o| o.name)
                .collect();
            return Err(CliError::Usage(format!(
                "Invalid parameter '{key}' for file format '{}' (ch-img measure supports {})",
                format.name,
                keys.join(", ")
            )));
        }
    }
    if let Some(size) = size {
        create.size = size;
    }
    let measure = (format.measure)(&create).map_err(CliError::Usage)?;
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
    let m = measure
        .measure(input.as_ref().map(|i| i.format().as_ref()))
        .map_err(|e| match e {
            MeasureError::Refused(why) => CliError::Usage(why),
            MeasureError::BlockStatus { offset, source } => {
                CliError::BlockStatus { offset, source }
            }
        })?;
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
