//! Image paths that are NBD URIs: which ones are ([`is_nbd_path`]), and
//! the name QEMU gives each ([`qemu_filename`]).

use std::path::Path;

use nbd::client::NbdUri;

/// Whether an image path is an NBD URI (`nbd://HOST[:PORT]/NAME`,
/// `nbd+unix:///NAME?socket=PATH`, QEMU's older `nbd:` spellings): it
/// opens as an export ([`super::NbdFile`]), not as a local file.
pub fn is_nbd_path(path: &Path) -> bool {
    path.to_str().is_some_and(NbdUri::looks_like)
}

/// How QEMU names an opened image path: an NBD URI (any spelling) by
/// the name QEMU's NBD driver gives the export ([`NbdUri::qemu_name`]),
/// any other path as it is. qemu-img prints it as `info`'s `image:` and
/// `filename`, and in `map`'s File column.
pub fn qemu_filename(path: &str) -> String {
    match NbdUri::parse(path) {
        Ok(uri) if is_nbd_path(Path::new(path)) => uri.qemu_name(),
        _ => path.to_string(),
    }
}
