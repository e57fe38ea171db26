//! The block crate's error type. Variants are named after the operation
//! that failed, and carry the underlying cause as a `#[source]`.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BlockError {
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is locked by another process (another VMM or qemu has it open)")]
    Locked { path: PathBuf },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The image is malformed or hostile; the message says what was wrong.
    #[error("invalid image {path}: {reason}")]
    InvalidImage { path: PathBuf, reason: String },
    /// The image uses something we do not implement; names the feature.
    #[error("unsupported image feature in {path}: {feature}")]
    Unsupported { path: PathBuf, feature: String },
    #[error("request out of range: offset {offset} length {len} beyond disk size {size}")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("guest memory range {addr:#x}+{len} is not mapped")]
    BadGuestMemory { addr: u64, len: u32 },
    #[error("refusing to write a raw image's first sector so that it looks like a {format} image")]
    ProbedRawHeaderWrite { format: &'static str },
    #[error("read failed at host offset {offset}")]
    Read {
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("write failed at host offset {offset}")]
    Write {
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("flush (fdatasync) failed")]
    Flush(#[source] io::Error),
    #[error("discard/zeroing (fallocate) failed at host offset {offset}")]
    Fallocate {
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error("metadata read failed: {what}")]
    MetadataRead {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("metadata write failed: {what}")]
    MetadataWrite {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("image is full: no host cluster can be allocated ({0})")]
    NoSpace(String),
    #[error("compressed cluster at host offset {offset} is corrupt: {reason}")]
    Decompress { offset: u64, reason: String },
    #[error("io_uring setup failed")]
    UringSetup(#[source] io::Error),
    #[error("io_uring submission failed")]
    UringSubmit(#[source] io::Error),
    #[error("preallocation={mode} of {path} failed ({errno})")]
    Preallocate {
        path: PathBuf,
        mode: &'static str,
        errno: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("engine=aio for {path}: {reason}")]
    AioUnavailable { path: PathBuf, reason: String },
    #[error("Linux AIO context setup (io_setup) failed")]
    AioSetup(#[source] io::Error),
    #[error("waiting for Linux AIO completions (io_getevents) failed")]
    AioWait(#[source] io::Error),
    #[error("eventfd operation failed")]
    EventFd(#[source] io::Error),
    #[error("resize failed: {0}")]
    Resize(String),
    #[error("the image was marked corrupt earlier in this run; refusing further writes")]
    Corrupt,
}

impl BlockError {
    /// Whether the operation is simply not offered (virtio-blk answers
    /// UNSUPP instead of IOERR).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, BlockError::Unsupported { .. })
    }
}
