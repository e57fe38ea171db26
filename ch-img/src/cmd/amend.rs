//! `ch-img amend [-p] [-q] [-f fmt] [-t cache] [--force] -o options FILE`
//!
//! qemu-img 7.2's amend for qcow2 images: `compat` (0.10/v2, 1.1/v3),
//! `lazy_refcounts`, `refcount_bits`, `data_file` (images that have one),
//! `data_file_raw` (cleared only), `backing_file`/`backing_fmt` (only as
//! they are: changing them is `rebase`'s job) and `size`. The `-o` words
//! are parsed as qemu-img parses them (a later key wins; its messages for
//! bad values, unknown keys and creation-only keys); then the block crate
//! checks the whole amendment against the image and refuses it, in
//! qemu-img's words, before anything changes
//! ([`block::formats::Amendable`]), and applies it. A new size is set
//! through the image's resizer: before the other changes, or after them
//! when the image is upgraded to version 3 first (as qemu-img orders
//! them); such an amend changes the image in two steps.
//!
//! Without `size` the image is opened keeping its persistent bitmaps
//! (they survive an upgrade or a new refcount width, as with qemu-img; a
//! downgrade drops them, version 2 cannot hold them). With `size` it is
//! opened as `resize` opens it, which leaves the bitmaps inconsistent.
//!
//! `-p` prints qemu-img's progress (its arithmetic over the upgrade, the
//! refcount width change and the downgrade); `-o help` lists the options.

use block::formats::{AmendStep, Amendment, FormatDriver, ImageInfo, FORMATS};
use block::options::CacheMode;
use block::{BlockError, ImageType};

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::option_help::{amend_help, wants_help};
use crate::options::{
    driver_of, open_image_cached, open_image_keeping_bitmaps, option_items, parse_bool,
    parse_cache, parse_format, CacheFlag,
};
use crate::progress::StepProgress;
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "oft",
    short_flags: "pqh",
    long_with_value: &[],
    long_flags: &["force"],
};

/// qcow2's creation options that amend does not take.
const CREATE_ONLY: &[&str] = &[
    "cluster_size",
    "compression_type",
    "encrypt.cipher-alg",
    "encrypt.cipher-mode",
    "encrypt.format",
    "encrypt.hash-alg",
    "encrypt.ivgen-alg",
    "encrypt.ivgen-hash-alg",
    "encrypt.key-secret",
    "encryption",
    "extended_l2",
    "preallocation",
];

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let values = p.values("o");
    if values.is_empty() {
        return Err(CliError::Syntax("Must specify options (-o)".into()));
    }
    let mut progress = StepProgress::new(p.flag("p") && !p.flag("q"), 1.0);
    let status = amend(&p, &values, &mut progress);
    progress.end();
    status
}

fn amend(
    p: &crate::args::Parsed,
    values: &[&str],
    progress: &mut StepProgress,
) -> Result<u8, CliError> {
    let format = p.value("f").map(|f| parse_format(Some(f))).transpose()?;
    if let (Some(format), true) = (format, wants_help(values)) {
        print!("{}", amend_help(driver_of(format))?);
        return Ok(0);
    }
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let cache = parse_cache(p.value("t"), CacheMode::Writeback, CacheFlag::Target)?;
    let format = format.unwrap_or(ImageType::Auto);
    if wants_help(values) {
        let image = open_image_cached(path, format, true, cache)?;
        print!("{}", amend_help(format_of(&image.format().info()))?);
        return Ok(0);
    }
    let (amendment, compat) = parse_amendment(values)?;
    let image = match amendment.size {
        Some(_) => open_image_cached(path, format, false, cache)?,
        None => open_image_keeping_bitmaps(path, format, cache)?,
    };
    let resize_after = amendment.size.filter(|_| {
        compat.as_deref().is_some_and(|c| c == "1.1" || c == "v3")
            && image.format().info().compat.as_deref() == Some("0.10")
    });
    let info = image.format().info();
    let driver = format_of(&info);
    if driver.amend_options.is_none() {
        return Err(CliError::Usage(format!(
            "Format driver '{}' does not support option amendment",
            driver.name
        )));
    }
    // qemu-img's report starts here, and ends at 100 % whatever happens.
    progress.set(0.0);
    let mut result = apply(&image, &info, amendment, compat, progress);
    drop(image);
    if let (Ok(()), Some(size)) = (&result, resize_after) {
        // Upgraded first, as qemu-img orders it: resized as version 3.
        result = open_image_cached(path, format, false, cache).and_then(|image| {
            image.resize(size)?;
            image.close().map_err(CliError::Close)
        });
    }
    progress.set(100.0);
    result.map(|()| 0)
}

/// Checks and applies the amendment to the opened image, and closes it.
fn apply(
    image: &crate::image_io::ImageIo,
    info: &ImageInfo,
    mut amendment: Amendment,
    compat: Option<String>,
    progress: &mut StepProgress,
) -> Result<(), CliError> {
    if let Some(level) = compat {
        amendment.version = Some(match level.as_str() {
            "0.10" | "v2" => 2,
            "1.1" | "v3" => 3,
            _ => {
                return Err(CliError::Usage(format!(
                    "Unknown compatibility level {level}"
                )))
            }
        });
    }
    if amendment.size == Some(info.virtual_size) {
        amendment.size = None;
    }
    let tools = image.tools();
    tools.check_amendment(&amendment).map_err(amend_error)?;
    let version = if info.compat.as_deref() == Some("0.10") {
        2
    } else {
        3
    };
    let upgrading = amendment.version.is_some_and(|v| v > version);
    let operations = u64::from(amendment.version.is_some_and(|v| v != version))
        + u64::from(
            amendment
                .refcount_bits
                .is_some_and(|b| Some(b) != info.refcount_bits.map(u64::from)),
        );
    if let Some(size) = amendment.size.filter(|_| !upgrading) {
        image.resize(size)?;
    }
    let mut report = ProgressShare::new(operations, progress);
    tools
        .amend(&amendment, &mut |step, done, total| {
            report.step(step, done, total)
        })
        .map_err(amend_error)?;
    image.close().map_err(CliError::Close)
}

/// The driver of an opened image's format (raw for a format the
/// registry does not name, which has nothing to amend either).
fn format_of(info: &ImageInfo) -> &'static FormatDriver {
    FORMATS
        .by_name(info.format)
        .unwrap_or_else(|| FORMATS.fallback())
}

/// A refusal in qemu-img's words is printed as it is.
fn amend_error(e: BlockError) -> CliError {
    match e {
        BlockError::Refused(message) => CliError::Usage(message),
        other => CliError::Amend(other),
    }
}

/// The `-o` words as qemu-img's amend parses them; the compatibility
/// level is returned as given (qemu-img judges it once the image is
/// open).
fn parse_amendment(values: &[&str]) -> Result<(Amendment, Option<String>), CliError> {
    let mut a = Amendment::default();
    let mut compat = None;
    let mut backing_file = None;
    let mut backing_fmt = None;
    let usage = |m: String| CliError::Usage(m);
    for (key, val) in option_items(values) {
        let not_bool = || usage(format!("Parameter '{key}' expects 'on' or 'off'"));
        match key {
            "size" => {
                a.size = Some(parse_size(val).ok().ok_or_else(|| usage(
                    "Parameter 'size' expects a non-negative number below 2^64\nOptional suffix k, M, G, T, P or E means kilo-, mega-, giga-, tera-, peta-\nand exabytes, respectively.".into(),
                ))?)
            }
            "compat" => compat = Some(val.to_string()),
            "backing_file" => backing_file = Some(val.to_string()),
            "backing_fmt" => backing_fmt = Some(val.to_string()),
            "data_file" if val.is_empty() => {
                return Err(usage(
                    "data_file cannot be emptied: the image keeps its data in that file".into(),
                ))
            }
            "data_file" => a.data_file = Some(val.to_string()),
            "data_file_raw" => a.data_file_raw = Some(parse_bool(val).ok_or_else(not_bool)?),
            "lazy_refcounts" => a.lazy_refcounts = Some(parse_bool(val).ok_or_else(not_bool)?),
            "refcount_bits" => {
                a.refcount_bits = Some(val.parse().map_err(|_| {
                    usage("Parameter 'refcount_bits' expects a number".into())
                })?)
            }
            k if k.starts_with("encrypt.") && !CREATE_ONLY.contains(&k) => {
                return Err(usage(
                    "Can't amend encryption options - encryption not present".into(),
                ))
            }
            k if CREATE_ONLY.contains(&k) => {
                return Err(usage(format!(
                    "Invalid parameter '{k}'\nThis option is only supported for image creation"
                )))
            }
            k => return Err(usage(format!("Invalid parameter '{k}'"))),
        }
    }
    if backing_file.is_some() || backing_fmt.is_some() {
        a.backing = Some((backing_file, backing_fmt));
    }
    Ok((a, compat))
}

/// qemu's amend progress helper: each part of the work reports its own
/// progress, and the total is projected from the parts seen so far
/// (`operations` parts in all).
struct ProgressShare<'a> {
    operations: u64,
    completed: u64,
    offset_completed: u64,
    last: Option<AmendStep>,
    last_work: u64,
    out: &'a mut StepProgress,
}

impl<'a> ProgressShare<'a> {
    fn new(operations: u64, out: &'a mut StepProgress) -> Self {
        ProgressShare {
            operations: operations.max(1),
            completed: 0,
            offset_completed: 0,
            last: None,
            last_work: 0,
            out,
        }
    }

    fn step(&mut self, step: AmendStep, done: u64, work: u64) {
        if self.last != Some(step) {
            if self.last.is_some() {
                self.offset_completed += self.last_work;
                self.completed = (self.completed + 1).min(self.operations - 1);
            }
            self.last = Some(step);
        }
        self.last_work = work;
        let current = self.offset_completed + work;
        let projected = current * (self.operations - self.completed - 1) / (self.completed + 1);
        let total = (current + projected).max(1);
        // qemu: 100.f * offset / total, in single precision.
        self.out
            .set(100.0 * (self.offset_completed + done) as f32 / total as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(s: &str) -> Result<Amendment, String> {
        parse_amendment(&[s])
            .map(|(a, _)| a)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn options_as_qemu_img_parses_them() {
        let (a, compat) =
            parse_amendment(&["compat=v2,compat=1.1,lazy_refcounts=on,refcount_bits=64,size=1G"])
                .unwrap();
        assert_eq!(compat.as_deref(), Some("1.1"));
        assert_eq!(a.lazy_refcounts, Some(true));
        assert_eq!(a.refcount_bits, Some(64));
        assert_eq!(a.size, Some(1 << 30));
        assert_eq!(a.backing, None);
        assert_eq!(
            parsed("backing_fmt=qcow2").unwrap().backing,
            Some((None, Some("qcow2".into())))
        );
        assert_eq!(parsed("foo=1").unwrap_err(), "Invalid parameter 'foo'");
        assert!(parsed("cluster_size=4k")
            .unwrap_err()
            .ends_with("only supported for image creation"));
        assert_eq!(
            parsed("lazy_refcounts=maybe").unwrap_err(),
            "Parameter 'lazy_refcounts' expects 'on' or 'off'"
        );
        assert_eq!(
            parsed("refcount_bits=x").unwrap_err(),
            "Parameter 'refcount_bits' expects a number"
        );
        assert!(parsed("encrypt.keyslot=1")
            .unwrap_err()
            .contains("encryption not present"));
    }
}
