//! [`FormatDriver`]: what the block layer knows of one image format,
//! written once in the format's own folder and listed once in the
//! registry (`super::registry`): its name, how its header is recognised,
//! how an image of it is opened (on its own, or as an overlay's backing
//! image), created, checked and measured, and what `-o help` lists for
//! it. [`Formats`] is a set of drivers with the lookups callers need: by
//! name, by probing an image's first bytes, the fallback (raw).
//!
//! A format that opens other images (qcow2's backing chain, the backing
//! file a new overlay is checked against) does it through the
//! [`Formats`] it is handed, never through the registry, which names
//! every format: so no format module imports the registry.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::check_report::{CheckReport, Repair};
use super::create_options::CreateOptions;
use super::format::Format;
use super::measure::Measure;
use super::tools::ImageTools;
use crate::error::BlockError;
use crate::options::{DiskOptions, ImageType};

/// How many of an image's first bytes a probe is given: the longest
/// magic of a registered format (raise it for a format whose magic is
/// longer).
pub const PROBE_BYTES: usize = 4;

/// One line of `-o help`: an option's name, the kind of value it takes
/// and what it does (qemu-img's words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionDoc {
    pub name: &'static str,
    pub kind: &'static str,
    pub help: &'static str,
}

impl OptionDoc {
    pub const fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        OptionDoc { name, kind, help }
    }
}

/// The size of a new image: an option every format takes.
pub const SIZE_OPTION: OptionDoc = OptionDoc::new("size", "size", "Virtual disk size");

/// How an image is being opened, besides its options and file.
pub struct OpenContext<'a> {
    /// The format was probed, not named (a probed raw image refuses
    /// writes that would give it another format's header).
    pub probed: bool,
    /// The formats its backing images may have.
    pub formats: &'a Formats,
}

/// A backing image to open, found and checked by the overlay's format.
pub struct BackingOpen<'a> {
    /// Its options: read-only, the overlay's cache mode and locking.
    pub opts: DiskOptions,
    /// Its descriptor, opened with `opts`.
    pub file: File,
    /// A buffered descriptor of the same file (the overlay's
    /// copy-on-write reads).
    pub buffered: File,
    /// No backing format was recorded: the format was probed.
    pub probed: bool,
    /// Its canonical path, and those of the images above it (the cycle
    /// and depth checks one level further down).
    pub canon: PathBuf,
    pub chain: &'a mut Vec<PathBuf>,
    pub formats: &'a Formats,
}

/// An opened backing image, as an overlay keeps it.
pub struct OpenedBacking {
    pub image: Arc<dyn Format>,
    /// Buffered read-only descriptors of its local files, indexed like
    /// `image.files()`.
    pub buffered: Vec<Arc<File>>,
    /// Images in its chain (1 for an image without a backing file).
    pub layers: u32,
}

/// Opens an image of a format from its file.
pub type OpenFn =
    fn(&DiskOptions, File, OpenContext<'_>) -> Result<Arc<dyn ImageTools>, BlockError>;

/// Checks (and repairs) the image at a path.
pub type CheckFn = fn(&Path, Option<Repair>) -> Result<CheckReport, BlockError>;

/// See the module docs. Every format fills in every field; a capability
/// a format lacks is `None` or `false`, and each front end answers it
/// in qemu-img's words.
pub struct FormatDriver {
    /// The name `-f`, `image_type=` and a backing format take.
    pub name: &'static str,
    /// Whether an image's first bytes (its first [`PROBE_BYTES`], or
    /// all of a shorter file) are this format's header; `None` for the
    /// format of a file no other format claims (raw).
    pub probe: Option<fn(&[u8]) -> bool>,
    /// Opens an image of this format from `file` (opened with the
    /// options' access mode), with every capability.
    pub open: OpenFn,
    /// Opens an image of this format read-only, as a backing image.
    pub open_backing: fn(BackingOpen<'_>) -> Result<OpenedBacking, BlockError>,
    /// Creates an image; each refusal names the option.
    pub create: fn(&CreateOptions, &Formats) -> Result<(), BlockError>,
    /// Checks (and repairs) the image at a path; `None`: nothing to
    /// check.
    pub check: Option<CheckFn>,
    /// Checks the options of a new image and returns what measures one
    /// (`ch-img measure`); `Err` in qemu-img's words.
    pub measure: fn(&CreateOptions) -> Result<Box<dyn Measure>, String>,
    /// qemu-img's "Formatting '...'" line for a new image.
    pub formatting: fn(&CreateOptions) -> String,
    /// The options of a new image (`create -o help`), in name order.
    pub create_options: &'static [OptionDoc],
    /// The same with those of the file protocol (`create -o help FILE`),
    /// which is every option a new image of this format takes.
    pub create_options_with_file: &'static [OptionDoc],
    /// The options `amend` changes; `None` when it changes none.
    pub amend_options: Option<&'static [OptionDoc]>,
    /// Whether an image may point at a backing file.
    pub backing_files: bool,
    /// Whether an image may hold compressed clusters (`convert -c`).
    pub compressed_clusters: bool,
}

impl FormatDriver {
    /// The [`ImageType`] that names this format.
    pub fn image_type(&'static self) -> ImageType {
        ImageType::Format(self.name)
    }

    /// Whether a new image takes options of its own, besides its size
    /// and the file protocol's.
    pub fn has_own_create_options(&self) -> bool {
        self.create_options.iter().any(|o| o.name != "size")
    }

    /// Whether `key` is an option a new image of this format takes.
    pub fn takes_create_option(&self, key: &str) -> bool {
        self.create_options_with_file.iter().any(|o| o.name == key)
    }
}

/// A set of format drivers (see the module docs).
pub struct Formats {
    drivers: &'static [&'static FormatDriver],
}

impl Formats {
    pub const fn new(drivers: &'static [&'static FormatDriver]) -> Self {
        Formats { drivers }
    }

    /// Every driver, in registry order.
    pub fn all(&self) -> &'static [&'static FormatDriver] {
        self.drivers
    }

    /// The driver named `name`.
    pub fn by_name(&self, name: &str) -> Option<&'static FormatDriver> {
        self.drivers.iter().copied().find(|d| d.name == name)
    }

    /// The driver `t` names; `None` for `Auto` (probe) or a name no
    /// driver has.
    pub fn driver(&self, t: ImageType) -> Option<&'static FormatDriver> {
        t.name().and_then(|name| self.by_name(name))
    }

    /// The format of a file no other format claims: the first driver
    /// without a probe (raw).
    pub fn fallback(&self) -> &'static FormatDriver {
        self.drivers
            .iter()
            .copied()
            .find(|d| d.probe.is_none())
            .expect("the registry has a format that claims what no other does")
    }

    /// The format an image's first bytes claim ([`Formats::fallback`]
    /// when none does).
    pub fn probe(&self, first_bytes: &[u8]) -> &'static FormatDriver {
        self.drivers
            .iter()
            .copied()
            .find(|d| d.probe.is_some_and(|claims| claims(first_bytes)))
            .unwrap_or_else(|| self.fallback())
    }

    /// The [`ImageType`] a registered name names.
    pub fn image_type(&self, name: &str) -> Option<ImageType> {
        self.by_name(name).map(|d| d.image_type())
    }

    /// `image_type=`'s value: `auto` or a registered format's name.
    pub fn parse_image_type(&self, s: &str) -> Result<ImageType, String> {
        if s == "auto" {
            return Ok(ImageType::Auto);
        }
        self.image_type(s).ok_or_else(|| {
            format!(
                "unknown image type '{s}' (expected auto, {})",
                self.names_or()
            )
        })
    }

    /// The formats' names as a choice: "raw or qcow2".
    pub fn names_or(&self) -> String {
        let names: Vec<&str> = self.drivers.iter().map(|d| d.name).collect();
        match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}
