//! The layers of a running disk's backing chain, as stream and commit
//! name them: the active image at depth 0, then each backing file, with
//! the name its overlay records, its open format and its file's identity.
//!
//! A running [`Disk`] enters [`layers_of`]; [`Layer`]s leave, which
//! [`find_layer`] searches for a name a request gives (a local path is
//! compared by device and inode, so another name of the same file is
//! found too; an NBD URI as written), and [`backing_name`] turns into the
//! name an overlay's header records for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::disk::Disk;
use crate::formats::Format;
use crate::new_file::FileIdentity;
use block_engines::nbd::is_nbd_path;

/// One image of the chain.
#[derive(Clone)]
pub struct Layer {
    /// 0: the active image.
    pub depth: u32,
    /// Its path (the disk's for the active image; else the name its
    /// overlay records, resolved against the overlay's folder).
    pub path: PathBuf,
    /// The name exactly as its overlay's header records it.
    pub recorded: Option<String>,
    pub format: Arc<dyn Format>,
    /// The device and inode of its local file (none over NBD).
    pub identity: Option<FileIdentity>,
}

impl Layer {
    pub fn format_name(&self) -> &'static str {
        self.format.name()
    }
}

/// Every layer of `disk`'s open chain, the active image first.
pub fn layers_of(disk: &Disk) -> Vec<Layer> {
    let mut out = Vec::new();
    let mut format = Arc::clone(disk.format());
    let mut path = disk.options().path.clone();
    let mut recorded = None;
    loop {
        let identity = if is_nbd_path(&path) {
            None
        } else {
            format
                .files()
                .local()
                .first()
                .and_then(|f| FileIdentity::of(f).ok())
        };
        let info = format.info();
        let below = format.backing();
        out.push(Layer {
            depth: out.len() as u32,
            path,
            recorded,
            format,
            identity,
        });
        match (below, info.full_backing_filename) {
            (Some(b), Some(name)) => {
                format = b;
                path = PathBuf::from(name);
                recorded = info.backing_filename;
            }
            _ => return out,
        }
    }
}

/// The index of the layer `name` names (see the module docs).
pub fn find_layer(layers: &[Layer], name: &str) -> Option<usize> {
    let p = Path::new(name);
    if is_nbd_path(p) {
        return layers.iter().position(|l| l.path == p);
    }
    let id = FileIdentity::of_path(p).ok()?;
    layers.iter().position(|l| l.identity.as_ref() == Some(&id))
}

/// The backing file name an image at `overlay` records for `base`: the
/// name `base`'s old overlay recorded when both overlays share a folder
/// (a relative name stays relative), else `base`'s absolute path.
pub fn backing_name(overlay: &Path, base: &Layer, old_overlay: &Path) -> String {
    if is_nbd_path(&base.path) {
        return base.path.display().to_string();
    }
    let folder = |p: &Path| {
        p.parent().and_then(|d| {
            std::fs::canonicalize(if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            })
            .ok()
        })
    };
    match &base.recorded {
        Some(name) if folder(overlay).is_some() && folder(overlay) == folder(old_overlay) => {
            name.clone()
        }
        _ => base
            .path
            .canonicalize()
            .unwrap_or_else(|_| base.path.clone())
            .display()
            .to_string(),
    }
}
