//! `ch-img create [-f fmt] [-o opts] [-b backing [-F backing_fmt]] [-u] [-q] FILE [SIZE]`
//!
//! `-o preallocation=off|metadata|falloc|full` (raw: off, falloc, full)
//! lays the image out as qemu-img does ([`block::prealloc`]).
//!
//! Builds a [`CreateOptions`] from qemu-img's options, checks the backing
//! file as qemu-img does (not the new image itself; opened for its size
//! and format, or with `-u` not opened at all, the size then required),
//! prints qemu-img's "Formatting ..." line and calls
//! [`block::create::create_image`], which locks the file before it
//! truncates it.

use block::create::{create_image, CreateOptions, FileIdentity};
use block::options::CacheMode;
use block::ImageType;

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::option_help::{create_help, wants_help};
use crate::options::{apply_create_options, driver_of, open_reader, option_items, parse_format};
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "fobF",
    short_flags: "uqh",
    long_with_value: &[],
    long_flags: &[],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let mut opts = CreateOptions {
        format: match parse_format(p.value("f"))? {
            ImageType::Auto => ImageType::RAW,
            f => f,
        },
        ..Default::default()
    };
    if wants_help(&p.values("o")) {
        print!(
            "{}",
            create_help(driver_of(opts.format), !p.operands.is_empty())
        );
        return Ok(0);
    }
    apply_create_options(&mut opts, &p.values("o"))?;
    let size_option = option_items(&p.values("o"))
        .iter()
        .any(|(key, _)| *key == "size");
    if let Some(b) = p.value("b") {
        opts.backing_file = Some(b.to_string());
    }
    if let Some(f) = p.value("F") {
        opts.backing_fmt = Some(parse_format(Some(f))?);
    }
    let (path, size) = match p.operands.as_slice() {
        [path] => (path, None),
        [path, size] => (path, Some(size)),
        [] => return Err(CliError::Usage("Expecting image file name".into())),
        _ => return Err(CliError::Usage("Unexpected argument after the size".into())),
    };
    opts.path = path.into();
    if size.is_some() && size_option {
        return Err(CliError::Usage(format!(
            "{path}: The image size must be specified only once"
        )));
    }
    if let Some(size) = size {
        opts.size = parse_size(size).ok().ok_or_else(|| {
            CliError::Usage(
                "Invalid image size specified. You may use k, M, G, T, P or E suffixes for kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.".into(),
            )
        })?;
    } else if (opts.backing_file.is_none() || p.flag("u")) && opts.size == 0 {
        return Err(CliError::Usage(format!(
            "{path}: Image creation needs a size parameter"
        )));
    }
    let format = driver_of(opts.format);
    if !format.backing_files && opts.backing_file.is_some() {
        return Err(CliError::Usage(format!(
            "{} images do not support backing files",
            format.name
        )));
    }
    if opts.backing_file.is_some() {
        check_backing(&mut opts, p.flag("u"))?;
    }
    if !p.flag("q") {
        println!("{}", (format.formatting)(&opts));
    }
    create_image(&opts).map_err(|source| match source {
        // What the target cannot do (an NBD export that is too small),
        // as qemu-img says it: the file, then the reason.
        block::BlockError::CannotDo { image, reason } => {
            CliError::Usage(format!("{image}: {reason}"))
        }
        source => CliError::Create {
            path: opts.path.clone(),
            source,
        },
    })?;
    Ok(0)
}

/// Checks the backing file as qemu-img does before anything is written:
/// it is not the new image itself (by device and inode, so `./X` and links
/// count too); without `-u` (`unsafe_backing`) it opens (its size is the
/// default size) and its format must be given, with `-u` it is not opened
/// at all (it may be missing; the size is then required) but its format
/// must still be given.
fn check_backing(opts: &mut CreateOptions, unsafe_backing: bool) -> Result<(), CliError> {
    let Some(backing) = opts.backing_file.clone() else {
        return Ok(());
    };
    let image = opts.path.display().to_string();
    let resolved = backing_path(&opts.path, &backing);
    let same = |a: &std::path::Path, b: &std::path::Path| matches!((FileIdentity::of_path(a), FileIdentity::of_path(b)), (Ok(x), Ok(y)) if x == y);
    if backing == image || same(&opts.path, std::path::Path::new(&resolved)) {
        return Err(CliError::Usage(format!(
            "{image}: Error: Trying to create an image with the same filename as the backing file"
        )));
    }
    opts.unsafe_backing = unsafe_backing;
    if unsafe_backing {
        if opts.backing_fmt.is_none() {
            return Err(CliError::Usage(format!(
                "{image}: Backing file specified without backing format"
            )));
        }
        return Ok(());
    }
    let fmt = opts.backing_fmt.unwrap_or(ImageType::Auto);
    let opened = open_reader(&resolved, fmt, CacheMode::Writeback, true).map_err(|e| {
        let why = match e {
            CliError::OpenFile { path, reason } => format!("Could not open '{path}': {reason}"),
            // qemu-img gives the reason alone for an export.
            CliError::OpenNbd { reason, .. } => reason,
            CliError::Open { source, .. } => backing_open_error(&resolved, &source),
            other => crate::error::chain(&other),
        };
        CliError::Usage(format!("{image}: {why}\nCould not open backing image."))
    })?;
    if opts.backing_fmt.is_none() {
        // qemu-img (since 6.1) refuses to guess the backing format.
        return Err(CliError::Usage(format!(
            "{image}: Backing file specified without backing format\nDetected format of {}.",
            opened.format().name()
        )));
    }
    if opts.size == 0 {
        opts.size = opened.size();
    }
    Ok(())
}

/// The backing file's path, resolved against the new image's folder as
/// the image will resolve it (an NBD URI is not a path: as it is).
fn backing_path(image: &std::path::Path, backing: &str) -> String {
    if block::engines::nbd::is_nbd_path(std::path::Path::new(backing)) {
        return backing.to_string();
    }
    let path = match image.parent() {
        Some(dir) if !std::path::Path::new(backing).is_absolute() => dir.join(backing),
        _ => backing.into(),
    };
    path.to_string_lossy().into_owned()
}

/// Why the backing file did not open, in qemu-img's words where it has
/// them ("Could not open 'B': No such file or directory").
fn backing_open_error(path: &str, e: &block::BlockError) -> String {
    match e {
        block::BlockError::Open { source, .. } => format!(
            "Could not open '{path}': {}",
            crate::error::os_message(source)
        ),
        other => crate::error::chain(other),
    }
}
