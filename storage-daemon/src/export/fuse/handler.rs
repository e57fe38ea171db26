//! The request dispatcher both transports share: a parsed FUSE request
//! in ([`FuseRequest`]), an [`Action`] out: either a reply to send now, or
//! a block request for the queue's [`block::DiskQueue`] plus what to
//! reply when its completion comes back
//! ([`Pending::reply`](super::reply::Pending::reply)). The data requests
//! are [`super::io`]'s, the attributes [`super::attr`]'s; the request and
//! reply types sit below them all ([`super::request`], [`super::reply`]).
//!
//! Nothing here blocks on image data I/O;
//! only metadata work (resize, block status) runs inline, as the block
//! crate's rules allow.

use std::sync::Arc;

use super::abi::{opcode, OpenOut, Pod, StatfsOut, FOPEN_DIRECT_IO, FOPEN_PARALLEL_DIRECT_WRITES};
use super::attr::ExportState;
use super::reply::{Action, Reply};
use super::request::FuseRequest;

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
    use crate::export::fuse::request::tests::dev_buffer;

    #[test]
    fn unknown_and_unexpected_requests_are_refused() {
        let path = std::env::temp_dir().join(format!("fuse-dispatch-{}", std::process::id()));
        std::fs::File::create(&path).unwrap().set_len(4096).unwrap();
        let mut options = block::DiskOptions::new(&path);
        options.image_type = block::ImageType::RAW;
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
}
