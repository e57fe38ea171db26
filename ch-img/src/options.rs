//! Option values shared by several verbs: `-f` formats, `-o key=value`
//! creation options, `-t`/`-T` cache modes, and opening an image
//! read-only or read-write in a cache mode, locked as qemu-img locks it:
//! a reader refuses an image someone writes unless `-U` (force-share), a
//! writer refuses an image anyone else uses.
//!
//! Words from the command line enter; block-crate option structs leave.

use block::create::CreateOptions;
use block::formats::{FormatDriver, FORMATS};
use block::options::CacheMode;
use block::{BlockError, DiskOptions, ImageType};

use crate::error::CliError;
use crate::image_io::ImageIo;
use ch_util::size::parse_size;

/// Parses `-f`/`-O`/`-F`: a format of the block layer's registry ("raw",
/// "qcow2"; `None`: probe).
pub fn parse_format(value: Option<&str>) -> Result<ImageType, CliError> {
    match value {
        None => Ok(ImageType::Auto),
        Some(name) => FORMATS
            .image_type(name)
            .ok_or_else(|| CliError::Usage(format!("Unknown file format '{name}'"))),
    }
}

/// The driver of a format `parse_format` returned (`Auto`: the default
/// of a new image, raw).
pub fn driver_of(format: ImageType) -> &'static FormatDriver {
    FORMATS.driver(format).unwrap_or_else(|| FORMATS.fallback())
}

/// Which cache option a value came from: qemu-img words its error
/// differently for `-t` (the image written) and `-T` (the source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheFlag {
    /// `-t`: the image the verb writes.
    Target,
    /// `-T`: the image the verb reads.
    Source,
}

/// Parses a `-t`/`-T` value (`None`: `default`). qemu-img also takes
/// "off" for "none".
pub fn parse_cache(
    value: Option<&str>,
    default: CacheMode,
    flag: CacheFlag,
) -> Result<CacheMode, CliError> {
    let Some(value) = value else {
        return Ok(default);
    };
    let word = if value == "off" { "none" } else { value };
    word.parse().map_err(|_| {
        CliError::Usage(match flag {
            CacheFlag::Target => format!("Invalid cache option: {value}"),
            CacheFlag::Source => format!("Invalid source cache option: {value}"),
        })
    })
}

/// Opens an image for a verb in the default cache mode (writeback).
pub fn open_image(path: &str, fmt: ImageType, readonly: bool) -> Result<ImageIo, CliError> {
    open_image_cached(path, fmt, readonly, CacheMode::Writeback)
}

/// Opens an image for a verb in cache mode `cache`; errors name the file
/// like qemu-img does, and a file system that refuses O_DIRECT is named
/// with the mode that asked for it (there is no buffered fallback).
pub fn open_image_cached(
    path: &str,
    fmt: ImageType,
    readonly: bool,
    cache: CacheMode,
) -> Result<ImageIo, CliError> {
    open_with(path, fmt, readonly, false, cache)
}

/// Opens an image read-only for a verb that only reads it; `force_share`
/// (`-U`) lets it open an image that another process writes.
pub fn open_reader(
    path: &str,
    fmt: ImageType,
    cache: CacheMode,
    force_share: bool,
) -> Result<ImageIo, CliError> {
    open_with(path, fmt, true, force_share, cache)
}

/// [`open_image_cached`]; with `force_share` the read-only files (the
/// image itself when `readonly`, its backing chain always) let other
/// processes write them.
pub fn open_with(
    path: &str,
    fmt: ImageType,
    readonly: bool,
    force_share: bool,
    cache: CacheMode,
) -> Result<ImageIo, CliError> {
    let mut opts = DiskOptions::new(path);
    opts.readonly = readonly;
    opts.force_share = force_share;
    opts.image_type = fmt;
    opts.direct = cache.direct();
    ImageIo::open(&opts, cache).map_err(|source| open_error(path, cache, source))
}

/// Opens an image read-write for a verb that changes its persistent
/// bitmaps or format options but never what the disk reads (`bitmap`,
/// `amend`): the bitmaps stay valid, guest writes are refused
/// ([`DiskOptions::keep_persistent_bitmaps`]).
pub fn open_image_keeping_bitmaps(
    path: &str,
    fmt: ImageType,
    cache: CacheMode,
) -> Result<ImageIo, CliError> {
    let mut opts = DiskOptions::new(path);
    opts.image_type = fmt;
    opts.direct = cache.direct();
    opts.keep_persistent_bitmaps = true;
    ImageIo::open(&opts, cache).map_err(|source| open_error(path, cache, source))
}

/// Opens an image read-write *without* its backing chain, for a verb that
/// only edits its header (`rebase -u`): a missing or broken backing file
/// does not stop it, and the image refuses guest writes.
pub fn open_header_only(path: &str, fmt: ImageType, cache: CacheMode) -> Result<ImageIo, CliError> {
    let mut opts = DiskOptions::new(path);
    opts.no_backing = true;
    opts.image_type = fmt;
    opts.direct = cache.direct();
    ImageIo::open(&opts, cache).map_err(|source| open_error(path, cache, source))
}

/// qemu-img's refusal of `-U` where the verb writes the image.
pub fn refuse_force_share(path: &str, force_share: bool) -> Result<(), CliError> {
    if force_share {
        return Err(CliError::ForceShareWritable { path: path.into() });
    }
    Ok(())
}

/// `-U` or `--force-share` on the command line.
pub fn force_share(p: &crate::args::Parsed) -> bool {
    p.flag("U") || p.flag("force-share")
}

/// `Open`, or `DirectRefused` when O_DIRECT was asked for and the open
/// failed with EINVAL (what file systems without O_DIRECT answer), or
/// qemu-img's words when the file itself does not open (missing, no
/// permission). An NBD export that does not open is named once, by the
/// path as given, then why (`Failed to connect to 'SOCKET': ...` as
/// qemu-img says it).
pub fn open_error(path: &str, cache: CacheMode, source: BlockError) -> CliError {
    // The export is the image itself, or (another URI) its backing file.
    let nbd = |uri: &str, why: String| CliError::OpenNbd {
        path: path.into(),
        reason: if uri == path {
            why
        } else {
            format!("Could not open backing file: {why}")
        },
    };
    match &source {
        BlockError::NbdConnect { uri, source: why } => {
            return nbd(uri, crate::error::chain_without_errno(why.as_ref()))
        }
        BlockError::Nbd { uri, reason } => return nbd(uri, reason.clone()),
        _ => {}
    }
    match &source {
        BlockError::Open {
            path: failed,
            source: io,
        } if failed.as_os_str() == path
            && !(cache.direct() && io.raw_os_error() == Some(libc::EINVAL)) =>
        {
            CliError::OpenFile {
                path: path.into(),
                reason: crate::error::os_message(io),
            }
        }
        BlockError::Open { source: io, .. }
            if cache.direct() && io.raw_os_error() == Some(libc::EINVAL) =>
        {
            CliError::DirectRefused {
                path: path.into(),
                mode: cache,
                source,
            }
        }
        _ => CliError::Open {
            path: path.into(),
            source,
        },
    }
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
        "size" => opts.size = parse_size(val).ok().ok_or_else(bad)?,
        "preallocation" => opts.preallocation = val.parse().map_err(CliError::Usage)?,
        "cluster_size" => opts.cluster_size = Some(parse_size(val).ok().ok_or_else(bad)?),
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

pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "on" | "true" | "yes" => Some(true),
        "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_values_and_qemu_img_errors() {
        let t = |v| parse_cache(Some(v), CacheMode::Unsafe, CacheFlag::Target);
        assert_eq!(t("off").unwrap(), CacheMode::None);
        assert_eq!(t("directsync").unwrap(), CacheMode::Directsync);
        assert_eq!(
            parse_cache(None, CacheMode::Unsafe, CacheFlag::Target).unwrap(),
            CacheMode::Unsafe
        );
        let msg = |r: Result<CacheMode, CliError>| match r {
            Err(CliError::Usage(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(msg(t("bogus")), "Invalid cache option: bogus");
        assert_eq!(
            msg(parse_cache(
                Some("x"),
                CacheMode::Writeback,
                CacheFlag::Source
            )),
            "Invalid source cache option: x"
        );
    }

    #[test]
    fn o_direct_refusal_names_file_and_mode() {
        let refused = || BlockError::Open {
            path: "/mnt/img".into(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        };
        let e = open_error("/mnt/img", CacheMode::Directsync, refused());
        let text = crate::error::chain(&e);
        assert!(
            text.contains("'/mnt/img'") && text.contains("directsync") && text.contains("O_DIRECT"),
            "{text}"
        );
        // Without O_DIRECT the same errno is an ordinary open error, in
        // qemu-img's words.
        let e = open_error("/mnt/img", CacheMode::Writeback, refused());
        assert_eq!(
            crate::error::chain(&e),
            "Could not open '/mnt/img': Could not open '/mnt/img': Invalid argument"
        );
    }
}
