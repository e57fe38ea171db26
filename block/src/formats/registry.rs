//! The registry of image formats: [`FORMATS`] lists every format the
//! block layer probes, opens, creates, checks and measures, each by the
//! driver its folder defines ([`super::driver::FormatDriver`]). A new
//! format is a folder under `formats/` and one line here.
//!
//! The entry points that take an image by its options open it through
//! the registry ([`open_format`], [`open_image_tools`]); the formats
//! themselves are handed the registry where they open other images (a
//! backing chain), so nothing below this module names it.

use std::sync::Arc;

use super::driver::Formats;
use super::format::Format;
use super::open::open_with;
use super::qcow2;
use super::raw;
use super::tools::ImageTools;
use crate::error::BlockError;
use crate::options::DiskOptions;
use block_engines::nbd::is_nbd_path;

/// Every format, in the order `-f`'s help and refusals list them. A
/// probe asks each driver that has one; raw is what none claims.
pub static FORMATS: Formats = Formats::new(&[&raw::DRIVER, &qcow2::DRIVER]);

/// Opens `opts.path` as the format it names (or probes), queue-facing.
pub fn open_format(opts: &DiskOptions) -> Result<Arc<dyn Format>, BlockError> {
    Ok(open_with(&FORMATS, opts)?)
}

/// Opens `opts.path` with its tool capabilities, for a caller that drives
/// the format itself (tests, fuzzing); tools that also do I/O use
/// [`crate::ExclusiveImage::open`].
pub fn open_image_tools(opts: &DiskOptions) -> Result<Arc<dyn ImageTools>, BlockError> {
    open_with(&FORMATS, opts)
}

/// Opens the qcow2 overlay `opts.path` with every capability, its
/// backing image being `backing` (already open, from `backing_path`)
/// instead of a second open of the file its header names; the header
/// must name `backing_path`. Only qcow2 overlays can be opened so.
pub fn open_overlay_tools(
    opts: &DiskOptions,
    backing: Arc<dyn Format>,
    backing_path: &std::path::Path,
) -> Result<Arc<dyn ImageTools>, BlockError> {
    if !matches!(opts.image_type.name(), None | Some("qcow2")) || is_nbd_path(&opts.path) {
        return Err(BlockError::Unsupported {
            path: opts.path.clone(),
            feature: "an overlay over an open image that is not a local qcow2 file".into(),
        });
    }
    let image = qcow2::overlay::open_overlay_over(opts, backing, backing_path, &FORMATS)?;
    Ok(Arc::new(image))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::ImageType;

    #[test]
    fn every_format_has_one_name_and_raw_is_the_fallback() {
        let names: Vec<&str> = FORMATS.all().iter().map(|d| d.name).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(names, unique);
        assert_eq!(FORMATS.fallback().image_type(), ImageType::RAW);
        assert_eq!(FORMATS.probe(b"QFI\xfb").name, "qcow2");
        assert_eq!(FORMATS.probe(b"\0\0\0\0").name, "raw");
        assert_eq!(FORMATS.probe(b"QF").name, "raw");
        assert_eq!(
            FORMATS.parse_image_type("qcow2"),
            Ok(ImageType::Format("qcow2"))
        );
        assert_eq!(FORMATS.parse_image_type("auto"), Ok(ImageType::Auto));
        assert_eq!(
            FORMATS.parse_image_type("vhdx").unwrap_err(),
            "unknown image type 'vhdx' (expected auto, raw or qcow2)"
        );
    }
}
