//! Making engines: [`new_engine`] makes one engine of a kind over local
//! files; [`queue_engine`] makes the engine of one queue of an image,
//! over its [`ImageFiles`]: a file engine for the local files, routed
//! with an NBD engine per remote file.
//!
//! Enters as an [`EngineKind`] (never resolved here: `Auto` means sync),
//! the files and the queue's completion eventfd; leaves as a boxed
//! [`Engine`] that signals that eventfd.

use std::fs::File;
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::aio::{self, AioEngine};
use crate::engine::Engine;
use crate::error::BlockError;
use crate::files::ImageFiles;
use crate::kind::EngineKind;
use crate::nbd::route::RoutedEngine;
use crate::sync::SyncEngine;
use crate::threads::{self, ThreadsEngine, WorkerPool};
use crate::uring::{self, UringEngine};

/// Creates the engine `kind` (`Auto` means sync here) over `files`,
/// signalling `eventfd`. A `threads` engine made here gets a pool of its
/// own; [`queue_engine`] takes the pool its caller shares.
pub fn new_engine(
    kind: EngineKind,
    files: &[Arc<File>],
    eventfd: Arc<EventFd>,
) -> Result<Box<dyn Engine>, BlockError> {
    match kind {
        EngineKind::IoUring => Ok(Box::new(UringEngine::new(
            files,
            eventfd,
            uring::DEFAULT_ENTRIES,
        )?)),
        EngineKind::Aio => Ok(Box::new(AioEngine::new(
            files,
            eventfd,
            aio::DEFAULT_DEPTH,
        )?)),
        EngineKind::Threads => Ok(Box::new(ThreadsEngine::new(
            files,
            eventfd,
            Arc::new(WorkerPool::new(threads::DEFAULT_MAX_THREADS)),
        ))),
        EngineKind::Sync | EngineKind::Auto => Ok(Box::new(SyncEngine::new(files, eventfd))),
    }
}

/// The engine of one queue of an image whose files are `files`: a `kind`
/// engine over the local files (sync when there are none: an image that
/// is an NBD export needs no file engine), `threads` on the pool `pool`
/// gives, and an NBD engine per remote file, routed by file id.
pub fn queue_engine(
    kind: EngineKind,
    files: &ImageFiles,
    eventfd: Arc<EventFd>,
    pool: impl FnOnce() -> Arc<WorkerPool>,
) -> Result<Box<dyn Engine>, BlockError> {
    let kind = if files.local().is_empty() {
        EngineKind::Sync
    } else {
        kind
    };
    let local: Box<dyn Engine> = if kind == EngineKind::Threads {
        Box::new(ThreadsEngine::new(files.local(), eventfd, pool()))
    } else {
        new_engine(kind, files.local(), eventfd)?
    };
    let remote = files.remote_files();
    if remote.is_empty() {
        return Ok(local);
    }
    let eventfd = local.eventfd().clone();
    let engines = remote
        .iter()
        .map(|f| f.queue_engine(eventfd.clone()))
        .collect();
    Ok(Box::new(RoutedEngine::new(
        local,
        files.local().len(),
        engines,
    )))
}
