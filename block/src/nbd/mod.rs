//! NBD exports as images: an export opens as a raw disk ([`NbdImage`])
//! over its [`NbdFile`], the remote file the engines' NBD client reaches
//! through its connections (`block_engines::nbd`), or serves as a qcow2
//! overlay's read-only raw backing file.

mod image;

use std::sync::Arc;
use std::time::Duration;

pub use block_engines::nbd::{is_nbd_path, qemu_filename, start_connector, NbdFile};
pub use image::NbdImage;

use crate::error::BlockError;
use crate::formats::lacking::Lacking;
use crate::formats::probe::QCOW2_MAGIC;
use crate::options::{DiskOptions, ImageType};

fn nbd_error(path: &str, reason: impl Into<String>) -> BlockError {
    BlockError::Nbd {
        uri: path.to_string(),
        reason: reason.into(),
    }
}

fn connect(path: &str, opts: &DiskOptions) -> Result<Arc<NbdFile>, BlockError> {
    NbdFile::connect(path, Duration::from_secs(opts.reconnect_delay))
}

const QCOW2_INSIDE: &str = "holds a qcow2 image: qcow2 inside an NBD export is not supported; \
                            export its guest view (qemu-nbd -f qcow2, qemu-storage-daemon) instead";

/// Opens the export `opts.path` names as a raw disk.
pub(crate) fn open_image(opts: &DiskOptions) -> Result<Arc<NbdImage>, BlockError> {
    let path = opts.path.to_string_lossy().into_owned();
    if opts.snapshot.is_some() {
        return Err(Lacking {
            image: path,
            format: "raw",
        }
        .snapshot_view());
    }
    if opts.image_type == ImageType::Qcow2 {
        return Err(nbd_error(
            &path,
            "image_type=qcow2: qcow2 inside an NBD export is not supported",
        ));
    }
    let file = connect(&path, opts)?;
    if !opts.readonly && file.read_only() {
        return Err(nbd_error(
            &path,
            "the export is read-only; open it with readonly=on",
        ));
    }
    if opts.image_type == ImageType::Auto && file.size() >= 4 {
        let mut magic = [0u8; 4];
        file.read_at(0, &mut magic)?;
        if magic == QCOW2_MAGIC {
            return Err(nbd_error(&path, QCOW2_INSIDE));
        }
    }
    Ok(Arc::new(NbdImage::new(file, opts.readonly)))
}

/// What `qemu-img create -f raw` does on an export (also the output of
/// `dd` and `convert`): the export keeps its size, which must be at least
/// `size` (qemu's "Cannot grow NBD nodes"), and its first sector is
/// zeroed, so an old image header there is not probed again.
pub(crate) fn create_raw(path: &str, size: u64) -> Result<(), BlockError> {
    let file = connect(path, &DiskOptions::new(path))?;
    if file.read_only() {
        return Err(nbd_error(path, "the export is read-only"));
    }
    if size > file.size() {
        return Err(BlockError::CannotDo {
            image: path.to_string(),
            reason: "Cannot grow NBD nodes".into(),
        });
    }
    let first = vec![0u8; size.min(512) as usize];
    if !first.is_empty() {
        file.write_at(0, &first)?;
    }
    file.flush()
}

/// Opens the export `name` as the read-only raw backing image of an
/// overlay opened with `opts`.
pub(crate) fn open_backing(
    name: &str,
    format: Option<&str>,
    opts: &DiskOptions,
) -> Result<Arc<NbdImage>, BlockError> {
    if let Some(f) = format.filter(|f| *f != "raw") {
        return Err(nbd_error(
            name,
            format!("backing format '{f}': an NBD backing file is raw"),
        ));
    }
    let file = connect(name, opts)?;
    if format.is_none() && file.size() >= 4 {
        let mut magic = [0u8; 4];
        file.read_at(0, &mut magic)?;
        if magic == QCOW2_MAGIC {
            return Err(nbd_error(name, QCOW2_INSIDE));
        }
    }
    Ok(Arc::new(NbdImage::new(file, true)))
}
