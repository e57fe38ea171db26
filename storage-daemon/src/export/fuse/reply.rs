//! What becomes of a FUSE request: a [`Reply`] to send now, or a block
//! request to submit with what to answer when it completes ([`Action`],
//! [`Pending`]); a failure of the block layer answers with its errno
//! ([`failed`]). Every handler and both transports speak these types.

use block::{BlockError, BlockRequest, Completion, IoMemory};

use super::abi::{Pod, WriteOut};

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

#[cfg(test)]
mod tests {
    use super::*;

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
