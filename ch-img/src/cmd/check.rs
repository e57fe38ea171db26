//! `ch-img check [-f fmt] [--output=human|json] [-r leaks|all] [-q] FILE`
//!
//! Runs [`block::check::check_image`] and prints its report as qemu-img
//! does. Exit status: 0 clean, 1 check not completed, 2 corruptions,
//! 3 leaks only, 63 the format has no checks (raw).
//!
//! `-T` (default writeback) is checked like qemu-img checks it, and a mode
//! with O_DIRECT first opens the image that way (so a file system that
//! refuses O_DIRECT is reported); the check itself reads the metadata
//! through the block crate's checker, on a buffered descriptor.
//!
//! Locks, as qemu-img takes them, held for the whole check: the image's
//! reader lock (an image another process writes is refused unless `-U`),
//! or with `-r` its writer lock (refused while anyone else has it open;
//! `-U` with `-r` is refused as qemu-img refuses it); and a reader lock on
//! the backing chain, which qemu-img opens too.

use block::check::{check_image, CheckReport, Repair};
use block::formats::FORMATS;
use block::{BlockError, ImageType};
use serde_json::{json, Map, Value};

use crate::args::{parse, OptSpec};
use crate::cmd::{print_json, OutputFormat};
use crate::error::CliError;
use block::options::CacheMode;

use std::path::Path;

use block::lock::{lock_path, ImageLock, LockMode};
use block::DiskOptions;

use crate::image_io::ImageIo;
use crate::options::{
    force_share, open_reader, parse_cache, parse_format, refuse_force_share, CacheFlag,
};

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "frT",
    short_flags: "qUh",
    long_with_value: &["output"],
    long_flags: &["force-share"],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let output = OutputFormat::parse(p.value("output"))?;
    let quiet = p.flag("q");
    let repair = match p.value("r") {
        None => None,
        Some("leaks") => Some(Repair::Leaks),
        Some("all") => Some(Repair::All),
        Some(other) => {
            return Err(CliError::Usage(format!(
                "Invalid -r argument '{other}' (expected leaks or all)"
            )))
        }
    };
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let cache = parse_cache(p.value("T"), CacheMode::Writeback, CacheFlag::Source)?;
    let fmt = parse_format(p.value("f"))?;
    let shared = force_share(&p);
    if repair.is_some() {
        refuse_force_share(path, shared)?;
    }
    if cache.direct() {
        drop(open_reader(path, fmt, cache, shared)?);
    }
    // An NBD export has no local file to lock (its server has the image);
    // it is opened first, as qemu-img opens it, so a server that is not
    // there is reported as such.
    let _locks = if block::engines::nbd::is_nbd_path(Path::new(path)) {
        drop(open_reader(path, fmt, cache, shared)?);
        None
    } else {
        Some(lock_for_check(path, fmt, repair.is_some(), shared)?)
    };
    if FORMATS.driver(fmt).is_some_and(|f| f.check.is_none()) {
        eprintln!("ch-img: This image format does not support checks");
        return Ok(63);
    }
    let report = match check_image(path.as_ref(), repair) {
        Ok(r) => r,
        Err(BlockError::Unsupported { feature, .. }) if feature == "checks" => {
            eprintln!("ch-img: This image format does not support checks");
            return Ok(63);
        }
        Err(e) => {
            eprintln!("ch-img: Check failed: {}", crate::error::chain(&e));
            return Ok(1);
        }
    };
    // The findings go to stderr whatever the output format, as qemu-img
    // prints them.
    for m in &report.messages {
        eprintln!("{m}");
    }
    match output {
        OutputFormat::Json => print_json(&json_report(&report))?,
        OutputFormat::Human if !quiet => print!("{}", human_report(&report)),
        OutputFormat::Human => {}
    }
    Ok(exit_status(&report))
}

/// The locks a check holds (see the module docs): the image's own, and
/// its backing chain opened read-only. An image whose header cannot be
/// read gets only its own lock; the check then reports what is wrong.
fn lock_for_check(
    path: &str,
    fmt: ImageType,
    repair: bool,
    shared: bool,
) -> Result<(ImageLock, Option<ImageIo>), CliError> {
    let mode = match (repair, shared) {
        (true, _) => LockMode::Writer,
        (false, true) => LockMode::ForceShare,
        (false, false) => LockMode::Reader,
    };
    let own = lock_path(Path::new(path), mode).map_err(|source| CliError::Open {
        path: path.into(),
        source,
    })?;
    let mut opts = DiskOptions::new(path);
    opts.readonly = true;
    opts.no_backing = true;
    opts.lock = false;
    opts.image_type = fmt;
    let Ok(header) = ImageIo::open(&opts, CacheMode::Writeback) else {
        return Ok((own, None));
    };
    let info = header.format().info();
    let chain = match info.full_backing_filename {
        Some(backing) => {
            let backing_fmt = parse_format(info.backing_filename_format.as_deref())?;
            let opened = open_reader(&backing, backing_fmt, CacheMode::Writeback, shared);
            Some(opened.map_err(|e| match e {
                CliError::Open { source, .. } => CliError::Open {
                    path: path.into(),
                    source,
                },
                other => other,
            })?)
        }
        None => None,
    };
    Ok((own, chain))
}

/// qemu-img check's exit status for a completed check.
pub fn exit_status(r: &CheckReport) -> u8 {
    r.exit_code()
}

/// The JSON object with qemu-img 7.2's keys and order (zero counts of
/// optional keys left out, as qemu-img does).
pub fn json_report(r: &CheckReport) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Option<u64>| {
        if let Some(v) = v.filter(|&v| v > 0) {
            m.insert(k.into(), json!(v));
        }
    };
    put("image-end-offset", r.image_end_offset);
    put("compressed-clusters", r.compressed_clusters);
    put("total-clusters", r.total_clusters);
    put("corruptions", Some(r.corruptions));
    put("corruptions-fixed", Some(r.corruptions_fixed));
    m.insert("check-errors".into(), json!(r.check_errors));
    let mut put = |k: &str, v: Option<u64>| {
        if let Some(v) = v.filter(|&v| v > 0) {
            m.insert(k.into(), json!(v));
        }
    };
    put("leaks", Some(r.leaks));
    put("leaks-fixed", Some(r.leaks_fixed));
    put("allocated-clusters", r.allocated_clusters);
    m.insert("filename".into(), json!(r.filename));
    m.insert("format".into(), json!(r.format));
    if let Some(v) = r.fragmented_clusters.filter(|&v| v > 0) {
        m.insert("fragmented-clusters".into(), json!(v));
    }
    Value::Object(m)
}

/// qemu-img check's summary text.
pub fn human_report(r: &CheckReport) -> String {
    let mut s = String::new();
    if r.leaks_fixed > 0 || r.corruptions_fixed > 0 {
        s.push_str(&format!(
            "The following inconsistencies were found and repaired:\n\n    {} leaked clusters\n    {} corruptions\n\nDouble checking the fixed image now...\n",
            r.leaks_fixed, r.corruptions_fixed
        ));
    }
    let (corruptions, leaks) = (r.corruptions, r.leaks);
    if corruptions == 0 && leaks == 0 && r.check_errors == 0 {
        s.push_str("No errors were found on the image.\n");
    } else {
        if corruptions > 0 {
            s.push_str(&format!(
                "\n{corruptions} errors were found on the image.\nData may be corrupted, or further writes to the image may corrupt it.\n"
            ));
        }
        if leaks > 0 {
            s.push_str(&format!(
                "\n{leaks} leaked clusters were found on the image.\nThis means waste of disk space, but no harm to data.\n"
            ));
        }
        if r.check_errors > 0 {
            s.push_str(&format!(
                "\n{} internal errors have occurred during the check.\n",
                r.check_errors
            ));
        }
    }
    if let (Some(total), Some(alloc)) = (r.total_clusters, r.allocated_clusters) {
        if total > 0 && alloc > 0 {
            let pct = |n: u64, of: u64| n as f64 * 100.0 / of as f64;
            s.push_str(&format!(
                "{alloc}/{total} = {:.2}% allocated, {:.2}% fragmented, {:.2}% compressed clusters\n",
                pct(alloc, total),
                pct(r.fragmented_clusters.unwrap_or(0), alloc),
                pct(r.compressed_clusters.unwrap_or(0), alloc),
            ));
        }
    }
    if let Some(end) = r.image_end_offset {
        s.push_str(&format!("Image end offset: {end}\n"));
    }
    s
}
