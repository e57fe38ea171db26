//! qcow2's entry in the format registry ([`DRIVER`]): its magic, opening
//! an image and its chain (`opener`), opening one as a backing image one
//! level down a chain, creating (`new_image`), checking (`check`) and
//! measuring (`measure`) one, and what `-o help` lists for it (qemu-img's
//! lines for the options ch-img takes, word for word; the ones it
//! refuses, encryption and an external data file at creation, are left
//! out).

use std::fs::File;
use std::sync::Arc;

use super::check::check_qcow2;
use super::opener::{open_chain, open_qcow2};
use crate::error::BlockError;
use crate::formats::create_options::CreateOptions;
use crate::formats::driver::{
    BackingOpen, FormatDriver, OpenContext, OpenedBacking, OptionDoc, SIZE_OPTION,
};
use crate::formats::qcow2::on_disk::header::MAGIC;
use crate::formats::qcow2::tools::measure::measure;
use crate::formats::qcow2::tools::new_image::create_from_options;
use crate::formats::tools::ImageTools;
use crate::options::DiskOptions;

/// See the module docs.
pub static DRIVER: FormatDriver = FormatDriver {
    name: "qcow2",
    probe: Some(probe),
    open,
    open_backing,
    create: create_from_options,
    check: Some(check_qcow2),
    measure,
    formatting,
    create_options: CREATE,
    create_options_with_file: CREATE,
    amend_options: Some(AMEND),
    backing_files: true,
    compressed_clusters: true,
};

fn probe(first_bytes: &[u8]) -> bool {
    first_bytes.starts_with(&MAGIC.to_be_bytes())
}

fn open(
    opts: &DiskOptions,
    file: File,
    ctx: OpenContext<'_>,
) -> Result<Arc<dyn ImageTools>, BlockError> {
    // Qcow2Image locks its own file and its backing chain.
    Ok(Arc::new(open_qcow2(opts, file, ctx.formats)?))
}

fn open_backing(b: BackingOpen<'_>) -> Result<OpenedBacking, BlockError> {
    b.chain.push(b.canon);
    let img = open_chain(&b.opts, b.file, b.chain, b.formats)?;
    b.chain.pop();
    Ok(OpenedBacking {
        layers: 1 + img.chain.backing_layers(),
        buffered: img.chain.cow_files.to_vec(),
        image: Arc::new(img),
    })
}

/// qemu-img's "Formatting" line for a new qcow2 image.
fn formatting(o: &CreateOptions) -> String {
    let onoff = |b: bool| if b { "on" } else { "off" };
    let mut s = format!(
        "Formatting '{}', fmt=qcow2 cluster_size={} extended_l2={}{} compression_type={} size={}",
        o.path.display(),
        o.cluster_size.unwrap_or(65536),
        onoff(o.extended_l2),
        o.shown_preallocation(),
        if o.zstd { "zstd" } else { "zlib" },
        o.size
    );
    if let Some(b) = &o.backing_file {
        s.push_str(&format!(" backing_file={b}"));
    }
    if let Some(f) = o.backing_fmt.and_then(|f| f.name()) {
        s.push_str(&format!(" backing_fmt={f}"));
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

const BACKING_FILE: OptionDoc = OptionDoc::new("backing_file", "str", "File name of a base image");
const BACKING_FMT: OptionDoc =
    OptionDoc::new("backing_fmt", "str", "Image format of the base image");
const COMPAT: OptionDoc = OptionDoc::new(
    "compat",
    "str",
    "Compatibility level (v2 [0.10] or v3 [1.1])",
);
const LAZY_REFCOUNTS: OptionDoc = OptionDoc::new(
    "lazy_refcounts",
    "bool (on/off)",
    "Postpone refcount updates",
);
const REFCOUNT_BITS: OptionDoc = OptionDoc::new(
    "refcount_bits",
    "num",
    "Width of a reference count entry in bits",
);

/// `create -f qcow2 -o help`, in qemu-img's (alphabetical) order.
const CREATE: &[OptionDoc] = &[
    BACKING_FILE,
    BACKING_FMT,
    OptionDoc::new("cluster_size", "size", "qcow2 cluster size"),
    COMPAT,
    OptionDoc::new(
        "compression_type",
        "str",
        "Compression method used for image cluster compression",
    ),
    OptionDoc::new("extended_l2", "bool (on/off)", "Extended L2 tables"),
    LAZY_REFCOUNTS,
    OptionDoc::new(
        "preallocation",
        "str",
        "Preallocation mode (allowed values: off, metadata, falloc, full)",
    ),
    REFCOUNT_BITS,
    SIZE_OPTION,
];

/// `amend -f qcow2 -o help`.
const AMEND: &[OptionDoc] = &[
    BACKING_FILE,
    BACKING_FMT,
    COMPAT,
    OptionDoc::new("data_file", "str", "File name of an external data file"),
    OptionDoc::new(
        "data_file_raw",
        "bool (on/off)",
        "The external data file must stay valid as a raw image",
    ),
    LAZY_REFCOUNTS,
    REFCOUNT_BITS,
    SIZE_OPTION,
];
