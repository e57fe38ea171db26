//! The request dispatcher both transports share: a parsed FUSE request
//! in, an [`Action`] out: either a reply to send now, or a block request
//! for the queue's [`block::DiskQueue`] plus what to reply when its
//! completion comes back ([`Pending::reply`]).
//!
//! A transport hands over the request's three parts the way it received
//! them ([`FuseRequest`]): /dev/fuse delivers them back to back in one
//! buffer ([`FuseRequest::from_dev_buffer`] splits it), a ring entry in
//! its header and payload buffers. Nothing here blocks on image data I/O;
//! only metadata work (resize, block status) runs inline, as the block
//! crate's rules allow.

use std::sync::Arc;

use block::request::GuestSegment;
use block::{BlockError, BlockRequest, Completion, IoMemory};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::abi::{
    opcode, InHeader, OpenOut, Pod, ReadWriteIn, StatfsOut, WriteOut, FOPEN_DIRECT_IO,
    FOPEN_PARALLEL_DIRECT_WRITES,
};
use super::attr::ExportState;

/// One FUSE request as a transport received it.
pub struct FuseRequest<'a> {
    pub header: InHeader,
    /// The opcode's first argument (`fuse_write_in`, ...), maybe longer.
    pub arg: &'a [u8],
    /// What follows the first argument (write data).
    pub data: &'a [u8],
    /// Where a READ/WRITE may do its I/O in place (ring entries: the
    /// payload buffer `data` lies in); None: in a buffer of its own.
    pub in_place: Option<InPlace>,
}

/// A ring entry's payload buffer as request memory: the write data is
/// already at its start, and read data is left there for the reply
/// ([`Reply::Data`] of [`IoMemory::Guest`]), with no copy either way.
pub struct InPlace {
    pub mem: Arc<GuestMemoryMmap>,
    pub addr: GuestAddress,
    pub capacity: usize,
}

impl InPlace {
    /// The first `len` bytes of the buffer; None when they do not fit.
    pub fn memory(&self, len: usize) -> Option<IoMemory> {
        (len <= self.capacity).then(|| IoMemory::Guest {
            mem: self.mem.clone(),
            segments: vec![GuestSegment {
                addr: self.addr,
                len: len as u32,
            }],
        })
    }
}

/// Why a buffer is not a FUSE request.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than a `fuse_in_header`: nobody to answer.
    NoHeader,
    /// The header's length disagrees with the bytes received.
    BadLength(InHeader),
}

/// Size of the first argument of the opcodes whose data follows it.
fn first_arg_size(op: u32) -> usize {
    match op {
        opcode::WRITE | opcode::READ => std::mem::size_of::<ReadWriteIn>(),
        _ => 0,
    }
}

impl<'a> FuseRequest<'a> {
    /// Splits one /dev/fuse read: header, first argument, data.
    pub fn from_dev_buffer(buf: &'a [u8]) -> Result<Self, ParseError> {
        let header = InHeader::read_from(buf).ok_or(ParseError::NoHeader)?;
        let header_len = std::mem::size_of::<InHeader>();
        if header.len as usize != buf.len() {
            return Err(ParseError::BadLength(header));
        }
        let rest = &buf[header_len..];
        let split = first_arg_size(header.opcode).min(rest.len());
        Ok(FuseRequest {
            header,
            arg: rest,
            data: &rest[split..],
            in_place: None,
        })
    }
}

/// A reply to a request (errno values are positive here).
#[derive(Debug)]
pub enum Reply {
    Error(i32),
    Body(Vec<u8>),
    /// The data a READ brought back, in the request's own buffer: the
    /// transport copies it out once (ring) or writes it from there
    /// (/dev/fuse), with no copy in between; `IoMemory::Guest` when it
    /// was read in place (already in the ring entry's payload).
    Data(IoMemory),
    /// FORGET and INTERRUPT get no reply.
    Nothing,
}

impl Reply {
    /// The errno (negative, as the kernel wants it) and the body.
    pub fn parts(&self) -> (i32, &[u8]) {
        match self {
            Reply::Error(errno) => (-errno, &[]),
            Reply::Body(body) => (0, body),
            Reply::Data(IoMemory::Owned(v)) => (0, v),
            Reply::Data(IoMemory::Aligned(b)) => (0, b.as_slice()),
            Reply::Data(_) => (-libc::EIO, &[]),
            Reply::Nothing => (0, &[]),
        }
    }
}

impl PartialEq for Reply {
    fn eq(&self, other: &Self) -> bool {
        matches!(self, Reply::Nothing) == matches!(other, Reply::Nothing)
            && self.parts() == other.parts()
    }
}

/// What became of a request.
pub enum Action {
    Reply(Reply),
    /// Submit `request` (its `user_data` is the transport's to set) and
    /// answer with `pending.reply(completion)` when it completes.
    Submit {
        request: BlockRequest,
        pending: Pending,
    },
}

/// What a submitted request's completion turns into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// The data read is the body.
    Read,
    /// `fuse_write_out { size }`.
    Write { size: u32 },
    /// An empty body (flush, fsync, fallocate).
    Empty,
}

impl Pending {
    /// The answer to FUSE request `unique` once its block request completed.
    pub fn reply(self, unique: u64, completion: Completion) -> Reply {
        match (completion.result, self) {
            (Err(e), _) => failed(format_args!("fuse request {unique}"), &e),
            (Ok(_), Pending::Read) => match completion.memory {
                memory @ (IoMemory::Owned(_) | IoMemory::Aligned(_) | IoMemory::Guest { .. }) => {
                    Reply::Data(memory)
                }
                _ => Reply::Error(libc::EIO),
            },
            (Ok(_), Pending::Write { size }) => {
                Reply::Body(WriteOut { size, padding: 0 }.as_bytes().to_vec())
            }
            (Ok(_), Pending::Empty) => Reply::Body(Vec::new()),
        }
    }
}

/// The answer to a request that failed in the block layer: logged through
/// the block crate's one log of failed requests (at the error's level,
/// rate-limited), answered with the error's errno (the host's own where
/// there is one: EIO, ENOSPC...; [`BlockError::errno`]).
pub fn failed(request: std::fmt::Arguments<'_>, e: &BlockError) -> Reply {
    block::error_log::log_failed_request(request, e);
    Reply::Error(e.errno())
}

/// Answers or turns into a block request one FUSE request of a running
/// export (INIT was answered at start; a second one is refused).
pub fn dispatch(state: &Arc<ExportState>, req: &FuseRequest) -> Action {
    let reply = |r| Action::Reply(r);
    match req.header.opcode {
        opcode::GETATTR => reply(state.getattr()),
        opcode::SETATTR => reply(state.setattr(req.arg)),
        opcode::OPEN => reply(Reply::Body(
            OpenOut {
                fh: 0,
                open_flags: FOPEN_DIRECT_IO | FOPEN_PARALLEL_DIRECT_WRITES,
                backing_id: 0,
            }
            .as_bytes()
            .to_vec(),
        )),
        opcode::READ => super::io::read(state, req),
        opcode::WRITE => super::io::write(state, req),
        opcode::FSYNC | opcode::FLUSH => super::io::flush(state),
        opcode::FALLOCATE => super::io::fallocate(state, req.arg),
        opcode::LSEEK => reply(super::io::lseek(state, req.arg)),
        opcode::STATFS => reply(Reply::Body(
            StatfsOut {
                bsize: 512,
                frsize: 512,
                namelen: 255,
                ..Default::default()
            }
            .as_bytes()
            .to_vec(),
        )),
        opcode::RELEASE | opcode::DESTROY => reply(Reply::Body(Vec::new())),
        opcode::LOOKUP => reply(Reply::Error(libc::ENOENT)),
        opcode::FORGET | opcode::BATCH_FORGET => reply(Reply::Nothing),
        // The request it names (if any) is answered when its I/O
        // completes, as if no interrupt had come: no reply here.
        opcode::INTERRUPT => {
            let target = req.arg.get(..8).and_then(|b| b.try_into().ok());
            log::debug!(
                "fuse: INTERRUPT {} of request {:?}: answered when done",
                req.header.unique,
                target.map(u64::from_ne_bytes)
            );
            reply(Reply::Nothing)
        }
        opcode::INIT => {
            log::debug!("fuse: a second INIT (unique {})", req.header.unique);
            reply(Reply::Error(libc::EINVAL))
        }
        other => {
            log::debug!(
                "fuse: opcode {other} not implemented (unique {})",
                req.header.unique
            );
            reply(Reply::Error(libc::ENOSYS))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev_buffer(op: u32, arg: &[u8], data: &[u8]) -> Vec<u8> {
        let len = 40 + arg.len() + data.len();
        let h = InHeader {
            len: len as u32,
            opcode: op,
            unique: 9,
            nodeid: 1,
            ..Default::default()
        };
        [h.as_bytes(), arg, data].concat()
    }

    #[test]
    fn dev_buffer_splits_header_argument_and_data() {
        let w = ReadWriteIn {
            offset: 4096,
            size: 3,
            ..Default::default()
        };
        let buf = dev_buffer(opcode::WRITE, w.as_bytes(), b"abc");
        let req = FuseRequest::from_dev_buffer(&buf).unwrap();
        assert_eq!(req.header.opcode, opcode::WRITE);
        assert_eq!(ReadWriteIn::read_from(req.arg).unwrap().offset, 4096);
        assert_eq!(req.data, b"abc");
    }

    #[test]
    fn bad_lengths_are_refused() {
        assert_eq!(
            FuseRequest::from_dev_buffer(&[0u8; 10]).err(),
            Some(ParseError::NoHeader)
        );
        let mut buf = dev_buffer(opcode::GETATTR, &[0; 16], &[]);
        buf.push(0);
        assert!(matches!(
            FuseRequest::from_dev_buffer(&buf),
            Err(ParseError::BadLength(h)) if h.unique == 9
        ));
    }

    #[test]
    fn unknown_and_unexpected_requests_are_refused() {
        let path = std::env::temp_dir().join(format!("fuse-dispatch-{}", std::process::id()));
        std::fs::File::create(&path).unwrap().set_len(4096).unwrap();
        let mut options = block::DiskOptions::new(&path);
        options.image_type = block::ImageType::Raw;
        let image = block::ExclusiveImage::open(&options).unwrap();
        let state = Arc::new(ExportState::new(&image, false, false, false));
        let answer = |op: u32| {
            let buf = dev_buffer(op, &[], &[]);
            match dispatch(&state, &FuseRequest::from_dev_buffer(&buf).unwrap()) {
                Action::Reply(r) => r,
                Action::Submit { .. } => panic!("opcode {op} submitted I/O"),
            }
        };
        assert_eq!(answer(999), Reply::Error(libc::ENOSYS));
        assert_eq!(answer(opcode::INIT), Reply::Error(libc::EINVAL));
        assert_eq!(answer(opcode::LOOKUP), Reply::Error(libc::ENOENT));
        assert_eq!(answer(opcode::FORGET), Reply::Nothing);
        // A SETATTR or READ without its argument struct: EINVAL.
        assert_eq!(answer(opcode::SETATTR), Reply::Error(libc::EINVAL));
        assert_eq!(answer(opcode::READ), Reply::Error(libc::EINVAL));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn failed_requests_answer_the_host_errno() {
        let e = BlockError::Write {
            offset: 0,
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(failed(format_args!("test"), &e), Reply::Error(libc::ENOSPC));
        let e = BlockError::Read {
            offset: 0,
            source: std::io::Error::from_raw_os_error(libc::EIO),
        };
        assert_eq!(failed(format_args!("test"), &e), Reply::Error(libc::EIO));
        let e = BlockError::InvalidResize("x".into());
        assert_eq!(failed(format_args!("test"), &e), Reply::Error(libc::EINVAL));
    }
}
