//! The block layer's error type, on its bottom floor so that every floor
//! (engines, formats, executor, disk) fails with it. Variants are named
//! after the operation that failed, and carry the underlying cause as a
//! `#[source]`.
//!
//! Each error also knows its consequence ([`BlockError::consequence`]):
//! whether the operation is not offered, the request was the asker's
//! mistake, the host failed the I/O, the image is damaged, or setting up
//! failed; the errno an application should see ([`BlockError::errno`]);
//! and how loudly to log it ([`BlockError::log_level`]: a guest's bad
//! sector is not news, a host EIO is). This is the one seam every front
//! end answers through: virtio-blk turns the consequence into its status
//! byte, FUSE and NBD send the errno, an API answers a 4xx for the
//! asker's mistakes ([`BlockError::is_callers_mistake`]) and a 5xx for
//! the rest, and all of them log a failed request through
//! the block crate's `error_log`.

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
    /// Another process holds the image's locks (the block crate's `lock`);
    /// the text is qemu's: the permission `perm`, which either we wanted
    /// (`shared` false) or others hold and we would not share.
    #[error("Failed to get {}\"{perm}\" lock\nIs another process using the image [{}]?", if *shared { "shared " } else { "" }, path.display())]
    Locked {
        path: PathBuf,
        perm: &'static str,
        shared: bool,
    },
    /// A new image would replace a file the command reads.
    #[error("'{}' is also a file the command reads from (the same file); refusing to overwrite it", path.display())]
    OverwritesSource { path: PathBuf },
    /// `DiskOptions::snapshot` names no snapshot of the image.
    #[error("Can't find snapshot in {}", path.display())]
    NoSuchSnapshot { path: PathBuf },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The image is malformed or hostile; the message says what was wrong.
    #[error("invalid image {path}: {reason}")]
    InvalidImage { path: PathBuf, reason: String },
    /// The image's metadata puts guest bytes `guest..guest + len` (a data
    /// cluster, or all an L2 table maps) at host offset `host`, past the
    /// end of the file: a truncated image or a damaged table entry. qemu
    /// reads them as zeroes; `ch-img convert` salvages around them.
    #[error(
        "invalid image {}: the {what} of guest bytes {guest:#x}..{:#x} is at {host:#x}, beyond the end of the file",
        path.display(),
        guest.saturating_add(*len)
    )]
    BeyondEndOfFile {
        path: PathBuf,
        what: &'static str,
        host: u64,
        guest: u64,
        len: u64,
    },
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
    /// The host failed a resize (the file could not be grown or shrunk).
    #[error("resize failed: {0}")]
    Resize(String),
    /// A resize the asker should not have asked for: a size that is not a
    /// multiple of 512, beyond the format's limits, or refused for this
    /// image (a data file, v2 snapshots, writes in flight).
    #[error("invalid resize: {0}")]
    InvalidResize(String),
    /// A tool operation refused before changing anything, in qemu-img's
    /// words (`amend`, persistent bitmaps).
    #[error("{0}")]
    Refused(String),
    /// An operation this image cannot do by its nature, refused before
    /// anything changed: an NBD export's size is its server's (qemu-img:
    /// "Cannot resize NBD nodes"), a raw image has no snapshots or
    /// backing file. The asker's mistake. `reason` is in qemu-img's words
    /// where it has them; `image` is the path or the NBD URI.
    #[error("{image}: {reason}")]
    CannotDo { image: String, reason: String },
    #[error("the image was marked corrupt earlier in this run; refusing further writes")]
    Corrupt,
    #[error("the image has no file with index {0}")]
    NoSuchFile(u16),
    #[error("cannot allocate a {0}-byte aligned buffer")]
    BufferAlloc(usize),
    #[error("a request ended without a completion")]
    LostCompletion,
    #[error("cannot open NBD export {uri}")]
    NbdConnect {
        uri: String,
        #[source]
        source: Box<nbd::client::ConnectError>,
    },
    /// An NBD export that cannot be used as asked; the reason says why.
    #[error("NBD export {uri}: {reason}")]
    Nbd { uri: String, reason: String },
}

/// What an error means for the one who asked, from the asker's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consequence {
    /// The operation or feature is not offered (virtio-blk: UNSUPP).
    Unsupported,
    /// The request itself was wrong: out of range, unmapped memory, a
    /// write to a read-only disk. The asker's mistake; logged at debug.
    BadRequest,
    /// The host failed the I/O (EIO, ENOSPC, ...) or the image is full;
    /// logged at warn, rate-limited by the front end.
    HostIo,
    /// The image is damaged, hostile or was marked corrupt.
    Corrupt,
    /// Opening, locking or setting up an engine failed, or our own
    /// plumbing broke (a lost completion).
    Setup,
}

impl BlockError {
    pub fn consequence(&self) -> Consequence {
        use BlockError::*;
        match self {
            Unsupported { .. } => Consequence::Unsupported,
            OutOfRange { .. }
            | ReadOnly
            | BadGuestMemory { .. }
            | ProbedRawHeaderWrite { .. }
            | InvalidResize(_)
            | Refused(_)
            | CannotDo { .. } => Consequence::BadRequest,
            Read { .. }
            | Write { .. }
            | Flush(_)
            | Fallocate { .. }
            | MetadataRead { .. }
            | MetadataWrite { .. }
            | NoSpace(_)
            | Resize(_)
            | Preallocate { .. }
            | BufferAlloc(_) => Consequence::HostIo,
            InvalidImage { .. } | BeyondEndOfFile { .. } | Decompress { .. } | Corrupt => {
                Consequence::Corrupt
            }
            Open { .. }
            | Locked { .. }
            | OverwritesSource { .. }
            | NoSuchSnapshot { .. }
            | Lock { .. }
            | UringSetup(_)
            | UringSubmit(_)
            | AioUnavailable { .. }
            | AioSetup(_)
            | AioWait(_)
            | EventFd(_)
            | NoSuchFile(_)
            | LostCompletion
            | NbdConnect { .. }
            | Nbd { .. } => Consequence::Setup,
        }
    }

    /// How loudly a front end should log this error when a request meets
    /// it: debug for the asker's mistakes and what is not offered, warn
    /// for host I/O errors, error for damage and broken plumbing.
    pub fn log_level(&self) -> log::Level {
        match self.consequence() {
            Consequence::Unsupported | Consequence::BadRequest => log::Level::Debug,
            Consequence::HostIo => log::Level::Warn,
            Consequence::Corrupt | Consequence::Setup => log::Level::Error,
        }
    }
}

impl BlockError {
    /// The errno an application sees for this error (FUSE, NBD): the host's
    /// own errno where the error carries one (EIO, ENOSPC, EDQUOT...), else
    /// the closest match to what the error means.
    pub fn errno(&self) -> i32 {
        use BlockError::*;
        match self {
            Read { source, .. }
            | Write { source, .. }
            | Flush(source)
            | Fallocate { source, .. }
            | MetadataRead { source, .. }
            | MetadataWrite { source, .. }
            | Preallocate { source, .. }
            | Open { source, .. }
            | Lock { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            NoSpace(_) => libc::ENOSPC,
            ReadOnly => libc::EROFS,
            OutOfRange { .. } | InvalidResize(_) | Refused(_) => libc::EINVAL,
            BadGuestMemory { .. } => libc::EFAULT,
            ProbedRawHeaderWrite { .. } => libc::EPERM,
            Unsupported { .. } | CannotDo { .. } => libc::EOPNOTSUPP,
            Locked { .. } => libc::EAGAIN,
            BufferAlloc(_) => libc::ENOMEM,
            _ => libc::EIO,
        }
    }

    /// Whether the operation is simply not offered (virtio-blk answers
    /// UNSUPP instead of IOERR).
    pub fn is_unsupported(&self) -> bool {
        self.consequence() == Consequence::Unsupported
    }

    /// Whether the asker should not have asked (a bad size, a write to
    /// a read-only disk, an operation the image cannot do): an API
    /// answers it with a 4xx status, not a 5xx.
    pub fn is_callers_mistake(&self) -> bool {
        self.consequence() == Consequence::BadRequest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_mistakes_are_quiet_and_host_errors_are_not() {
        let eio = || io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(BlockError::ReadOnly.log_level(), log::Level::Debug);
        let range = BlockError::OutOfRange {
            offset: 1,
            len: 2,
            size: 0,
        };
        assert_eq!(range.consequence(), Consequence::BadRequest);
        let read = BlockError::Read {
            offset: 0,
            source: eio(),
        };
        assert_eq!(read.consequence(), Consequence::HostIo);
        assert_eq!(read.log_level(), log::Level::Warn);
        assert_eq!(BlockError::Corrupt.log_level(), log::Level::Error);
        assert_eq!(BlockError::LostCompletion.consequence(), Consequence::Setup);
        let unsupp = BlockError::Unsupported {
            path: "x".into(),
            feature: "y".into(),
        };
        assert!(unsupp.is_unsupported() && !read.is_unsupported());
        let mistake = BlockError::InvalidResize("size must be a multiple of 512 bytes".into());
        assert_eq!(mistake.consequence(), Consequence::BadRequest);
        assert_eq!(mistake.log_level(), log::Level::Debug);
        let nbd = BlockError::CannotDo {
            image: "nbd://h:10809/e".into(),
            reason: "Cannot resize NBD nodes".into(),
        };
        assert!(nbd.is_callers_mistake() && !nbd.is_unsupported());
        assert_eq!(nbd.log_level(), log::Level::Debug);
        assert_eq!(nbd.errno(), libc::EOPNOTSUPP);
        assert_eq!(nbd.to_string(), "nbd://h:10809/e: Cannot resize NBD nodes");
        assert!(!read.is_callers_mistake());
    }

    #[test]
    fn errnos_come_from_the_host_or_from_the_meaning() {
        let with = |errno| BlockError::Write {
            offset: 0,
            source: io::Error::from_raw_os_error(errno),
        };
        assert_eq!(with(libc::ENOSPC).errno(), libc::ENOSPC);
        assert_eq!(with(libc::EDQUOT).errno(), libc::EDQUOT);
        let no_errno = BlockError::Read {
            offset: 0,
            source: io::Error::other("short"),
        };
        assert_eq!(no_errno.errno(), libc::EIO);
        assert_eq!(BlockError::NoSpace("x".into()).errno(), libc::ENOSPC);
        assert_eq!(BlockError::ReadOnly.errno(), libc::EROFS);
        assert_eq!(BlockError::InvalidResize("x".into()).errno(), libc::EINVAL);
        assert_eq!(BlockError::Corrupt.errno(), libc::EIO);
        let unsupp = BlockError::Unsupported {
            path: "x".into(),
            feature: "y".into(),
        };
        assert_eq!(unsupp.errno(), libc::EOPNOTSUPP);
    }
}
