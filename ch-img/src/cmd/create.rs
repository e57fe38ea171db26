//! `ch-img create [-f fmt] [-o opts] [-b backing [-F backing_fmt]] [-u] [-q] FILE [SIZE]`
//!
//! `-o preallocation=off|metadata|falloc|full` (raw: off, falloc, full)
//! lays the image out as qemu-img does ([`block::prealloc`]).
//!
//! Builds a [`CreateOptions`] from qemu-img's options, prints qemu-img's
//! "Formatting ..." line and calls [`block::create::create_image`].

use block::create::{create_image, CreateOptions};
use block::ImageType;

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::option_help::{create_help, wants_help};
use crate::options::{apply_create_options, option_items, parse_format};
use crate::size::parse_size;

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
            ImageType::Auto => ImageType::Raw,
            f => f,
        },
        ..Default::default()
    };
    if wants_help(&p.values("o")) {
        print!("{}", create_help(opts.format, !p.operands.is_empty()));
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
        opts.size = parse_size(size).ok_or_else(|| {
            CliError::Usage(
                "Invalid image size specified. You may use k, M, G, T, P or E suffixes for kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.".into(),
            )
        })?;
    } else if opts.backing_file.is_none() && opts.size == 0 {
        return Err(CliError::Usage(format!(
            "{path}: Image creation needs a size parameter"
        )));
    }
    if opts.format == ImageType::Raw && opts.backing_file.is_some() {
        return Err(CliError::Usage(
            "raw images do not support backing files".into(),
        ));
    }
    if let (Some(backing), None) = (&opts.backing_file, opts.backing_fmt) {
        // qemu-img (since 6.1) refuses to guess the backing format.
        let detected = backing_image(&opts.path, backing, None)
            .map(|img| img.format().name())
            .unwrap_or("unknown");
        return Err(CliError::Usage(format!(
            "{}: Backing file specified without backing format\nDetected format of {detected}.",
            opts.path.display()
        )));
    }
    if opts.size == 0 {
        if let Some(backing) = &opts.backing_file {
            opts.size = backing_size(&opts.path, backing, opts.backing_fmt)?;
        }
    }
    if !p.flag("q") {
        println!("{}", formatting_line(&opts));
    }
    create_image(&opts).map_err(|source| CliError::Create {
        path: opts.path.clone(),
        source,
    })?;
    Ok(0)
}

/// qemu-img's "Formatting 'FILE', fmt=... size=..." line.
fn formatting_line(o: &CreateOptions) -> String {
    let path = o.path.display();
    // qemu-img names preallocation when it was given; we when it is not off.
    let prealloc = match o.preallocation {
        block::prealloc::Preallocation::Off => String::new(),
        p => format!(" preallocation={p}"),
    };
    if o.format == ImageType::Raw {
        return format!("Formatting '{path}', fmt=raw size={}{prealloc}", o.size);
    }
    let onoff = |b: bool| if b { "on" } else { "off" };
    let mut s = format!(
        "Formatting '{path}', fmt=qcow2 cluster_size={} extended_l2={}{prealloc} compression_type={} size={}",
        o.cluster_size.unwrap_or(65536),
        onoff(o.extended_l2),
        if o.zstd { "zstd" } else { "zlib" },
        o.size
    );
    if let Some(b) = &o.backing_file {
        s.push_str(&format!(" backing_file={b}"));
    }
    if let Some(f) = o.backing_fmt {
        s.push_str(&format!(
            " backing_fmt={}",
            if f == ImageType::Raw { "raw" } else { "qcow2" }
        ));
    }
    if let Some(c) = &o.compat {
        s.push_str(&format!(" compat={c}"));
    }
    s.push_str(&format!(
        " lazy_refcounts={} refcount_bits={}",
        onoff(o.lazy_refcounts),
        o.refcount_bits.unwrap_or(16)
    ));
    s
}

/// The virtual size of the backing file (qemu-img takes the size from it).
fn backing_size(
    image: &std::path::Path,
    backing: &str,
    fmt: Option<ImageType>,
) -> Result<u64, CliError> {
    Ok(backing_image(image, backing, fmt)?.size())
}

/// Opens the backing file, resolved against the new image's folder as the
/// image will resolve it.
fn backing_image(
    image: &std::path::Path,
    backing: &str,
    fmt: Option<ImageType>,
) -> Result<crate::image_io::ImageIo, CliError> {
    let path = match image.parent() {
        Some(dir) if !std::path::Path::new(backing).is_absolute() => dir.join(backing),
        _ => backing.into(),
    };
    let path = path.to_string_lossy().into_owned();
    crate::options::open_image(&path, fmt.unwrap_or(ImageType::Auto), true)
}
