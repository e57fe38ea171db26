//! `-o help`: the options `create` and `convert` take for a new image of
//! a format, and the ones `amend` changes, printed as qemu-img 7.2
//! prints them (its header line, `  name=<type>` padded to 22 columns,
//! ` - ` and the description, in name order, and its closing lines).
//!
//! `-o` values enter ([`wants_help`]); the text leaves. The lists hold
//! the options ch-img takes: qemu-img's lines for them, word for word;
//! the ones ch-img refuses (encryption, an external data file at
//! creation, the file protocol's `nocow` and `extent_size_hint`) are left
//! out.

use block::ImageType;

use crate::error::CliError;

/// One option's line.
struct OptionDoc {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const fn doc(name: &'static str, kind: &'static str, help: &'static str) -> OptionDoc {
    OptionDoc { name, kind, help }
}

const SIZE: OptionDoc = doc("size", "size", "Virtual disk size");
const BACKING_FILE: OptionDoc = doc("backing_file", "str", "File name of a base image");
const BACKING_FMT: OptionDoc = doc("backing_fmt", "str", "Image format of the base image");
const COMPAT: OptionDoc = doc(
    "compat",
    "str",
    "Compatibility level (v2 [0.10] or v3 [1.1])",
);
const LAZY_REFCOUNTS: OptionDoc = doc(
    "lazy_refcounts",
    "bool (on/off)",
    "Postpone refcount updates",
);
const REFCOUNT_BITS: OptionDoc = doc(
    "refcount_bits",
    "num",
    "Width of a reference count entry in bits",
);

/// `create -f qcow2 -o help`, in qemu-img's (alphabetical) order.
const QCOW2_CREATE: &[OptionDoc] = &[
    BACKING_FILE,
    BACKING_FMT,
    doc("cluster_size", "size", "qcow2 cluster size"),
    COMPAT,
    doc(
        "compression_type",
        "str",
        "Compression method used for image cluster compression",
    ),
    doc("extended_l2", "bool (on/off)", "Extended L2 tables"),
    LAZY_REFCOUNTS,
    doc(
        "preallocation",
        "str",
        "Preallocation mode (allowed values: off, metadata, falloc, full)",
    ),
    REFCOUNT_BITS,
    SIZE,
];

/// `create -f raw -o help` without a file name: the format's own options.
const RAW_CREATE: &[OptionDoc] = &[SIZE];

/// With a file name qemu-img adds the file protocol's options: for raw,
/// preallocation.
const RAW_CREATE_FILE: &[OptionDoc] = &[
    doc(
        "preallocation",
        "str",
        "Preallocation mode (allowed values: off, falloc, full)",
    ),
    SIZE,
];

/// `amend -f qcow2 -o help`.
const QCOW2_AMEND: &[OptionDoc] = &[
    BACKING_FILE,
    BACKING_FMT,
    COMPAT,
    doc("data_file", "str", "File name of an external data file"),
    doc(
        "data_file_raw",
        "bool (on/off)",
        "The external data file must stay valid as a raw image",
    ),
    LAZY_REFCOUNTS,
    REFCOUNT_BITS,
    SIZE,
];

/// Whether `-o` values ask for help (an item `help` or `?`, as qemu's
/// `is_help_option`).
pub fn wants_help(values: &[&str]) -> bool {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .any(|item| item == "help" || item == "?")
}

fn lines(header: &str, docs: &[OptionDoc], footer: bool) -> String {
    let mut text = format!("{header}\n");
    for d in docs {
        let left = format!("{}=<{}>", d.name, d.kind);
        text.push_str(&format!("  {left:<22} - {}\n", d.help));
    }
    if footer {
        text.push_str(
            "\nThe protocol level may support further options.\nSpecify the target filename to include those options.\n",
        );
    }
    text
}

/// What `create` / `convert` print for `-o help`: the options of a new
/// image of `format` (raw when not given), with those of the file
/// protocol when the command names the new file.
pub fn create_help(format: ImageType, with_filename: bool) -> String {
    let (name, docs) = match (format, with_filename) {
        (ImageType::Qcow2, _) => ("qcow2", QCOW2_CREATE),
        (_, false) => ("raw", RAW_CREATE),
        (_, true) => ("raw", RAW_CREATE_FILE),
    };
    if with_filename {
        lines("Supported options:", docs, false)
    } else {
        lines(&format!("Supported {name} options:"), docs, true)
    }
}

/// What `amend -o help` prints for an image of `format`; raw images
/// have no options to amend (qemu-img's error).
pub fn amend_help(format: ImageType) -> Result<String, CliError> {
    match format {
        ImageType::Qcow2 => Ok(lines("Amend options for 'qcow2':", QCOW2_AMEND, false)),
        _ => Err(CliError::Usage(
            "Format driver 'raw' does not support option amendment".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_items_are_found_among_others() {
        assert!(wants_help(&["cluster_size=4k,help"]));
        assert!(wants_help(&["a=1", "?"]));
        assert!(!wants_help(&["helpful=1", "size=help"]));
    }

    #[test]
    fn lines_are_padded_like_qemu_img() {
        let text = amend_help(ImageType::Qcow2).unwrap();
        assert!(text.contains("\n  backing_file=<str>     - File name of a base image\n"));
        assert!(text.contains(
            "\n  data_file_raw=<bool (on/off)> - The external data file must stay valid as a raw image\n"
        ));
        assert!(create_help(ImageType::Raw, false).ends_with("include those options.\n"));
        assert!(create_help(ImageType::Qcow2, true).starts_with("Supported options:\n"));
    }
}
