//! The NBD client: an NBD export as a file of an image, below the
//! formats (DESIGN.md, "NBD").
//!
//! A path that is an NBD URI (`nbd://HOST[:PORT]/NAME`,
//! `nbd+unix:///NAME?socket=PATH`) opens as an [`NbdImage`], a raw disk
//! whose one file is the export ([`NbdFile`]). A qcow2 overlay may name
//! such a URI as its backing file; its backing reads then go to the
//! export. Formats name an export as a *remote file*
//! ([`crate::formats::Format::remote_files`]), numbered after the local
//! files, so plans stay what they are: host extents in file N.
//!
//! The data path keeps the block layer's shape: a queue's engine is a
//! [`route::RoutedEngine`] over the file engine (local files) and one
//! [`engine::NbdEngine`] per export. The NBD engine turns each host op
//! into NBD commands on a connection ([`connection`]) and sends a whole
//! batch with one `sendmsg`; many commands are in flight per connection.
//! The connection's thread ([`io_thread`]) parses replies (the `nbd`
//! crate's reply parser), copies READ data into the requests' memory and
//! completes each op to its queue's completion list and eventfd, the
//! same eventfd and drain every engine uses. Inline work (copy-on-write
//! reads of a backing export, block status) runs as blocking operations
//! on the export's first connection.
//!
//! Queues share one connection unless the server advertises multi-conn,
//! then each queue has its own ([`file`]). A program that confines its
//! threads with seccomp opens every connection on one connector thread
//! whose filter allows sockets ([`connector`], [`start_connector`]). A lost connection is
//! reconnected with QEMU's `reconnect-delay` semantics (the disk key
//! `reconnect_delay`); a server that breaks the protocol is disconnected
//! for good.
//!
//! Why threads and not the queue's io_uring: several queues (and inline
//! callers) may share one connection, and its replies must reach
//! whichever queue asked; one reader per connection does that without a
//! lock on the request path of the file engines, and without touching
//! their rings.

mod connection;
mod connector;
mod engine;
mod file;
mod image;
mod inflight;
mod io_thread;
mod iov;
mod link;
mod route;
mod sink;

use std::sync::Arc;
use std::time::Duration;

pub use crate::options::is_nbd_path;
pub use connector::start_connector;
pub use file::NbdFile;
pub use image::NbdImage;
use nbd::client::{ClientConfig, NbdUri};

use crate::error::BlockError;
use crate::formats::lacking::Lacking;
use crate::formats::probe::QCOW2_MAGIC;
use crate::formats::Format;
use crate::io::Engine;
use crate::options::{DiskOptions, ImageType};
use link::Target;

/// How QEMU names an opened image path: an NBD URI (any spelling) by
/// the name QEMU's NBD driver gives the export ([`NbdUri::qemu_name`]),
/// any other path as it is. qemu-img prints it as `info`'s `image:` and
/// `filename`, and in `map`'s File column.
pub fn qemu_filename(path: &str) -> String {
    match NbdUri::parse(path) {
        Ok(uri) if is_nbd_path(std::path::Path::new(path)) => uri.qemu_name(),
        _ => path.to_string(),
    }
}

fn nbd_error(path: &str, reason: impl Into<String>) -> BlockError {
    BlockError::Nbd {
        uri: path.to_string(),
        reason: reason.into(),
    }
}

fn connect(path: &str, opts: &DiskOptions) -> Result<Arc<NbdFile>, BlockError> {
    let uri = NbdUri::parse(path).map_err(|e| nbd_error(path, e.reason))?;
    NbdFile::open(Target {
        cfg: ClientConfig {
            export: uri.export.clone(),
            structured: true,
            block_status: true,
        },
        uri,
        reconnect_delay: Duration::from_secs(opts.reconnect_delay),
    })
    .map_err(|e| match e {
        // Named as the caller spelled it.
        BlockError::NbdConnect { source, .. } => BlockError::NbdConnect {
            uri: path.to_string(),
            source,
        },
        e => e,
    })
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

/// A queue's engine: `local` alone, or routed with an NBD engine per
/// remote file of `format`.
pub(crate) fn queue_engine(local: Box<dyn Engine>, format: &dyn Format) -> Box<dyn Engine> {
    let remote = format.remote_files();
    if remote.is_empty() {
        return local;
    }
    let eventfd = local.eventfd().clone();
    let engines = remote
        .iter()
        .map(|f| f.queue_engine(eventfd.clone()))
        .collect();
    Box::new(route::RoutedEngine::new(
        local,
        format.files().len(),
        engines,
    ))
}
