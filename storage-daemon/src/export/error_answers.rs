//! One answer per block error, whichever front end meets it: the
//! virtio-blk status (the in-VMM device and the vhost-user export), the
//! FUSE errno and the NBD error number all come from the error itself
//! ([`BlockError::is_unsupported`], [`BlockError::errno`]), never from a
//! front end's own reading of the variants. The list of kinds below has
//! no wildcard, so a new kind of block error does not compile until it
//! is listed here, with a sample.

use std::collections::BTreeSet;
use std::io;

use block::BlockError;
use nbd::wire::consts::error as nbd_err;
use nbd::wire::nbd_error_from_errno;
use nbd_server::answer_block_error as nbd_failed;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP};
use virtio_devices::block::error_status::status_of;

use super::fuse::reply::{failed as fuse_failed, Reply};

macro_rules! kinds {
    ($($kind:pat),* $(,)?) => {
        /// Every kind of block error, as its pattern's text.
        const KINDS: &[&str] = &[$(stringify!($kind)),*];

        /// Which of [`KINDS`] `e` is.
        fn kind(e: &BlockError) -> &'static str {
            match e {
                $($kind => stringify!($kind)),*
            }
        }
    };
}

kinds!(
    BlockError::Open { .. },
    BlockError::Locked { .. },
    BlockError::OverwritesSource { .. },
    BlockError::NoSuchSnapshot { .. },
    BlockError::Lock { .. },
    BlockError::InvalidImage { .. },
    BlockError::BeyondEndOfFile { .. },
    BlockError::Unsupported { .. },
    BlockError::OutOfRange { .. },
    BlockError::ReadOnly,
    BlockError::BadGuestMemory { .. },
    BlockError::ProbedRawHeaderWrite { .. },
    BlockError::Read { .. },
    BlockError::Write { .. },
    BlockError::Flush(_),
    BlockError::Fallocate { .. },
    BlockError::MetadataRead { .. },
    BlockError::MetadataWrite { .. },
    BlockError::NoSpace(_),
    BlockError::Decompress { .. },
    BlockError::UringSetup(_),
    BlockError::UringSubmit(_),
    BlockError::Preallocate { .. },
    BlockError::AioUnavailable { .. },
    BlockError::AioSetup(_),
    BlockError::AioWait(_),
    BlockError::EventFd(_),
    BlockError::Resize(_),
    BlockError::InvalidResize(_),
    BlockError::Refused(_),
    BlockError::CannotDo { .. },
    BlockError::Corrupt,
    BlockError::NoSuchFile(_),
    BlockError::BufferAlloc(_),
    BlockError::LostCompletion,
    BlockError::NbdConnect { .. },
    BlockError::Nbd { .. },
);

fn os(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// At least one error of every kind; those that carry the host's errno
/// with a few different ones, and one without.
fn samples() -> Vec<BlockError> {
    let path = || "img".into();
    let text = || "x".to_string();
    vec![
        BlockError::Open {
            path: path(),
            source: os(libc::EACCES),
        },
        BlockError::Locked {
            path: path(),
            perm: "write",
            shared: false,
        },
        BlockError::OverwritesSource { path: path() },
        BlockError::NoSuchSnapshot { path: path() },
        BlockError::Lock {
            path: path(),
            source: os(libc::ENOLCK),
        },
        BlockError::InvalidImage {
            path: path(),
            reason: text(),
        },
        BlockError::BeyondEndOfFile {
            path: path(),
            what: "an L2 entry",
            host: 1 << 40,
            guest: 0,
            len: 65536,
        },
        BlockError::Unsupported {
            path: path(),
            feature: text(),
        },
        BlockError::OutOfRange {
            offset: 1,
            len: 2,
            size: 0,
        },
        BlockError::ReadOnly,
        BlockError::BadGuestMemory { addr: 0, len: 1 },
        BlockError::ProbedRawHeaderWrite { format: "qcow2" },
        BlockError::Read {
            offset: 0,
            source: os(libc::EIO),
        },
        BlockError::Read {
            offset: 0,
            source: io::Error::other("short read"),
        },
        BlockError::Write {
            offset: 0,
            source: os(libc::ENOSPC),
        },
        BlockError::Write {
            offset: 0,
            source: os(libc::EDQUOT),
        },
        BlockError::Flush(os(libc::EIO)),
        BlockError::Fallocate {
            offset: 0,
            source: os(libc::EOPNOTSUPP),
        },
        BlockError::MetadataRead {
            what: text(),
            source: os(libc::EIO),
        },
        BlockError::MetadataWrite {
            what: text(),
            source: os(libc::EROFS),
        },
        BlockError::NoSpace(text()),
        BlockError::Decompress {
            offset: 0,
            reason: text(),
        },
        BlockError::UringSetup(os(libc::ENOMEM)),
        BlockError::UringSubmit(os(libc::EBUSY)),
        BlockError::Preallocate {
            path: path(),
            mode: "full",
            errno: "ENOSPC",
            source: os(libc::ENOSPC),
        },
        BlockError::AioUnavailable {
            path: path(),
            reason: text(),
        },
        BlockError::AioSetup(os(libc::EAGAIN)),
        BlockError::AioWait(os(libc::EINTR)),
        BlockError::EventFd(os(libc::EMFILE)),
        BlockError::Resize(text()),
        BlockError::InvalidResize(text()),
        BlockError::Refused(text()),
        BlockError::CannotDo {
            image: text(),
            reason: text(),
        },
        BlockError::Corrupt,
        BlockError::NoSuchFile(3),
        BlockError::BufferAlloc(4096),
        BlockError::LostCompletion,
        BlockError::NbdConnect {
            uri: text(),
            source: Box::new(nbd::client::ConnectError::Connect {
                addr: text(),
                source: os(libc::ECONNREFUSED),
            }),
        },
        BlockError::Nbd {
            uri: text(),
            reason: text(),
        },
    ]
}

/// What each front end answers to `e`: virtio-blk's status byte, FUSE's
/// errno, NBD's error number.
fn answers(e: &BlockError) -> (u8, i32, u32) {
    let fuse = match fuse_failed(format_args!("test"), e) {
        Reply::Error(errno) => errno,
        other => panic!("FUSE answered {other:?} to {e:?}"),
    };
    (status_of(e), fuse, nbd_failed(format_args!("test"), e))
}

#[test]
fn every_kind_of_block_error_has_a_sample() {
    let sampled: BTreeSet<&str> = samples().iter().map(kind).collect();
    let all: BTreeSet<&str> = KINDS.iter().copied().collect();
    assert_eq!(sampled, all);
}

#[test]
fn the_three_front_ends_give_one_answer_per_error() {
    for e in samples() {
        let (virtio, fuse, nbd) = answers(&e);
        // FUSE and NBD send the error's errno, NBD in its own numbers.
        assert_eq!(fuse, e.errno(), "FUSE, {e:?}");
        assert_eq!(nbd, nbd_error_from_errno(e.errno()), "NBD, {e:?}");
        // virtio-blk has two failure statuses: UNSUPP exactly for what is
        // not offered, which FUSE and NBD call not supported too.
        if e.is_unsupported() {
            assert_eq!(virtio, VIRTIO_BLK_S_UNSUPP as u8, "virtio-blk, {e:?}");
            assert_eq!((fuse, nbd), (libc::EOPNOTSUPP, nbd_err::ENOTSUP), "{e:?}");
        } else {
            assert_eq!(virtio, VIRTIO_BLK_S_IOERR as u8, "virtio-blk, {e:?}");
        }
    }
}

/// The answers a reader can check by eye: a few kinds, the host's errno
/// passed through, and the kinds NBD used to answer EIO to where FUSE
/// said what they mean.
#[test]
fn answers_for_some_errors_by_name() {
    let samples = samples();
    let find = |want: &str| {
        samples
            .iter()
            .find(|e| kind(e) == want)
            .unwrap_or_else(|| panic!("no sample of {want}"))
    };
    let ioerr = VIRTIO_BLK_S_IOERR as u8;
    for (want, expected) in [
        ("BlockError::ReadOnly", (ioerr, libc::EROFS, nbd_err::EPERM)),
        (
            "BlockError::NoSpace(_)",
            (ioerr, libc::ENOSPC, nbd_err::ENOSPC),
        ),
        (
            "BlockError::OutOfRange { .. }",
            (ioerr, libc::EINVAL, nbd_err::EINVAL),
        ),
        (
            "BlockError::Unsupported { .. }",
            (
                VIRTIO_BLK_S_UNSUPP as u8,
                libc::EOPNOTSUPP,
                nbd_err::ENOTSUP,
            ),
        ),
        ("BlockError::Corrupt", (ioerr, libc::EIO, nbd_err::EIO)),
        // NBD answered EIO to these before (and to a host errno that
        // came with an open, lock or preallocation failure).
        (
            "BlockError::InvalidResize(_)",
            (ioerr, libc::EINVAL, nbd_err::EINVAL),
        ),
        (
            "BlockError::Refused(_)",
            (ioerr, libc::EINVAL, nbd_err::EINVAL),
        ),
        (
            "BlockError::BadGuestMemory { .. }",
            (ioerr, libc::EFAULT, nbd_err::EINVAL),
        ),
        (
            "BlockError::ProbedRawHeaderWrite { .. }",
            (ioerr, libc::EPERM, nbd_err::EPERM),
        ),
        (
            "BlockError::Locked { .. }",
            (ioerr, libc::EAGAIN, nbd_err::EINVAL),
        ),
        (
            "BlockError::BufferAlloc(_)",
            (ioerr, libc::ENOMEM, nbd_err::ENOMEM),
        ),
    ] {
        assert_eq!(answers(find(want)), expected, "{want}");
    }
    let write = |errno| BlockError::Write {
        offset: 0,
        source: os(errno),
    };
    assert_eq!(
        answers(&write(libc::EDQUOT)),
        (ioerr, libc::EDQUOT, nbd_err::ENOSPC)
    );
    let prealloc = find("BlockError::Preallocate { .. }");
    assert_eq!(answers(prealloc), (ioerr, libc::ENOSPC, nbd_err::ENOSPC));
}
