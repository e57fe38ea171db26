//! The data requests: READ, WRITE, FSYNC/FLUSH and FALLOCATE become block
//! requests ([`Action::Submit`]); LSEEK's SEEK_DATA/SEEK_HOLE is answered
//! from the format's block status. The limits are qemu-storage-daemon's:
//! reads stop at the end of the disk, writes past it grow the disk only
//! with `growable=on` (else they are cut short), fallocate allocates only
//! at the end, punches holes only with KEEP_SIZE and zeroes ranges.

use std::sync::Arc;

use block::{BlockRequest, IoMemory, RequestOp};

use super::abi::{FallocateIn, LseekIn, LseekOut, Pod, ReadWriteIn, WriteOut};
use super::attr::ExportState;
use super::mount::MAX_READ;
use super::reply::{failed, Action, Pending, Reply};
use super::request::FuseRequest;

fn submit(op: RequestOp, offset: u64, memory: IoMemory, pending: Pending) -> Action {
    Action::Submit {
        request: BlockRequest {
            user_data: 0,
            op,
            offset,
            memory,
        },
        pending,
    }
}

fn error(errno: i32) -> Action {
    Action::Reply(Reply::Error(errno))
}

fn empty() -> Action {
    Action::Reply(Reply::Body(Vec::new()))
}

pub fn read(state: &Arc<ExportState>, req: &FuseRequest) -> Action {
    let Some(rd) = ReadWriteIn::read_from(req.arg) else {
        return error(libc::EINVAL);
    };
    if rd.size > MAX_READ {
        log::debug!(
            "fuse: READ of {} bytes (unique {})",
            rd.size,
            req.header.unique
        );
        return error(libc::EINVAL);
    }
    let size = state.size();
    let len = u64::from(rd.size).min(size.saturating_sub(rd.offset));
    if len == 0 {
        return empty();
    }
    let in_place = req.in_place.as_ref().and_then(|p| p.memory(len as usize));
    let memory = in_place.unwrap_or_else(|| state.buffer(len as usize, &[]));
    submit(RequestOp::Read, rd.offset, memory, Pending::Read)
}

pub fn write(state: &Arc<ExportState>, req: &FuseRequest) -> Action {
    if !state.writable {
        return error(libc::EACCES);
    }
    let Some(wr) = ReadWriteIn::read_from(req.arg) else {
        return error(libc::EINVAL);
    };
    let Some(data) = req.data.get(..wr.size as usize) else {
        log::debug!(
            "fuse: WRITE of {} bytes carries {} (unique {})",
            wr.size,
            req.data.len(),
            req.header.unique
        );
        return error(libc::EINVAL);
    };
    let Some(end) = wr.offset.checked_add(data.len() as u64) else {
        return error(libc::EFBIG);
    };
    let mut len = data.len() as u64;
    if end > state.size() {
        if state.growable {
            if let Err(errno) = state.grow_to(end) {
                return error(errno);
            }
        } else {
            // qemu's export: a short write up to the end.
            len = state.size().saturating_sub(wr.offset);
        }
    }
    if len == 0 {
        return Action::Reply(Reply::Body(WriteOut::default().as_bytes().to_vec()));
    }
    // In place: `data` is the start of the entry's payload buffer.
    let in_place = req.in_place.as_ref().and_then(|p| p.memory(len as usize));
    let memory = in_place.unwrap_or_else(|| state.buffer(len as usize, &data[..len as usize]));
    submit(
        RequestOp::Write,
        wr.offset,
        memory,
        Pending::Write { size: len as u32 },
    )
}

/// FSYNC and FLUSH (close): a block flush, as qemu's `blk_flush`.
pub fn flush(state: &Arc<ExportState>) -> Action {
    if !state.writable {
        return empty();
    }
    submit(RequestOp::Flush, 0, IoMemory::None, Pending::Empty)
}

pub fn fallocate(state: &Arc<ExportState>, arg: &[u8]) -> Action {
    const KEEP_SIZE: u32 = libc::FALLOC_FL_KEEP_SIZE as u32;
    const PUNCH_HOLE: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32;
    const ZERO_RANGE: u32 = libc::FALLOC_FL_ZERO_RANGE as u32;
    if !state.writable {
        return error(libc::EACCES);
    }
    let Some(fa) = FallocateIn::read_from(arg) else {
        return error(libc::EINVAL);
    };
    let Some(end) = fa.offset.checked_add(fa.length) else {
        return error(libc::EFBIG);
    };
    let size = state.size();
    match fa.mode {
        // Plain allocation: only at the end, by growing the disk.
        0 => {
            if fa.offset < size {
                error(libc::EOPNOTSUPP)
            } else if fa.offset > size {
                error(libc::EINVAL)
            } else {
                state.grow_to(end).map_or_else(error, |()| empty())
            }
        }
        m if m == PUNCH_HOLE | KEEP_SIZE => {
            let len = fa.length.min(size.saturating_sub(fa.offset));
            if len == 0 {
                return empty();
            }
            // Unmap, and read back as zeroes whatever the backing image
            // holds (qemu: write_zeroes with MAY_UNMAP).
            let op = RequestOp::WriteZeroes {
                len,
                may_unmap: true,
            };
            submit(op, fa.offset, IoMemory::None, Pending::Empty)
        }
        m if m & !KEEP_SIZE == ZERO_RANGE => {
            if m & KEEP_SIZE == 0 && end > size {
                if let Err(errno) = state.grow_to(end) {
                    return error(errno);
                }
            }
            let len = fa.length.min(state.size().saturating_sub(fa.offset));
            if len == 0 {
                return empty();
            }
            let op = RequestOp::WriteZeroes {
                len,
                may_unmap: false,
            };
            submit(op, fa.offset, IoMemory::None, Pending::Empty)
        }
        m if m & PUNCH_HOLE != 0 && m & KEEP_SIZE == 0 => error(libc::EINVAL),
        _ => error(libc::EOPNOTSUPP),
    }
}

/// SEEK_DATA / SEEK_HOLE from the format's block status; a range that
/// reads as zeroes counts as a hole. Past the end: ENXIO for SEEK_DATA,
/// the offset itself for SEEK_HOLE (qemu's answers).
pub fn lseek(state: &Arc<ExportState>, arg: &[u8]) -> Reply {
    let Some(ls) = LseekIn::read_from(arg) else {
        return Reply::Error(libc::EINVAL);
    };
    let want_data = match ls.whence as i32 {
        libc::SEEK_DATA => true,
        libc::SEEK_HOLE => false,
        _ => return Reply::Error(libc::EINVAL),
    };
    let size = state.size();
    let found = |offset: u64| Reply::Body(LseekOut { offset }.as_bytes().to_vec());
    if ls.offset >= size {
        return if want_data {
            Reply::Error(libc::ENXIO)
        } else {
            found(ls.offset)
        };
    }
    let format = state.disk.format();
    let mut pos = ls.offset;
    while pos < size {
        let status = match format.block_status(pos, size - pos) {
            Ok(s) => s,
            Err(e) => return failed(format_args!("fuse lseek at {pos}"), &e),
        };
        let is_data = status.data && !status.zero;
        if is_data == want_data {
            return found(pos);
        }
        if status.len == 0 {
            break;
        }
        pos = pos.saturating_add(status.len);
    }
    if want_data {
        Reply::Error(libc::ENXIO)
    } else {
        found(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::fuse::abi::{opcode, InHeader};
    use block::{DiskOptions, ExclusiveImage};

    /// An export state over a sparse raw file of `size` bytes.
    fn state(
        name: &str,
        size: u64,
        writable: bool,
        growable: bool,
    ) -> (Arc<ExportState>, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("fuse-io-{name}-{}", std::process::id()));
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        let mut options = DiskOptions::new(&path);
        options.image_type = block::ImageType::RAW;
        let image = ExclusiveImage::open(&options).unwrap();
        (
            Arc::new(ExportState::new(&image, writable, growable, false)),
            path,
        )
    }

    fn request<'a>(op: u32, arg: &'a [u8], data: &'a [u8]) -> FuseRequest<'a> {
        FuseRequest {
            header: InHeader {
                opcode: op,
                unique: 1,
                ..Default::default()
            },
            arg,
            data,
            in_place: None,
        }
    }

    fn rw(offset: u64, size: u32) -> ReadWriteIn {
        ReadWriteIn {
            offset,
            size,
            ..Default::default()
        }
    }

    fn submitted(a: Action) -> (BlockRequest, Pending) {
        match a {
            Action::Submit { request, pending } => (request, pending),
            Action::Reply(r) => panic!("expected a block request, got {r:?}"),
        }
    }

    fn replied(a: Action) -> Reply {
        match a {
            Action::Reply(r) => r,
            Action::Submit { request, .. } => panic!("expected a reply, got {request:?}"),
        }
    }

    #[test]
    fn reads_stop_at_the_end() {
        let (s, path) = state("read", 8192, false, false);
        let arg = rw(4096, 8192);
        let (req, _) = submitted(read(&s, &request(opcode::READ, arg.as_bytes(), &[])));
        assert_eq!((req.offset, req.memory.len()), (4096, 4096));
        let arg = rw(8192, 10);
        assert_eq!(
            replied(read(&s, &request(opcode::READ, arg.as_bytes(), &[]))),
            Reply::Body(vec![])
        );
        let arg = rw(0, MAX_READ + 1);
        assert_eq!(
            replied(read(&s, &request(opcode::READ, arg.as_bytes(), &[]))),
            Reply::Error(libc::EINVAL)
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn ring_requests_do_their_io_in_place() {
        use crate::export::fuse::request::InPlace;
        use vm_memory::{GuestAddress, GuestMemoryMmap};
        let (s, path) = state("inplace", 1 << 20, true, false);
        let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 8192)]).unwrap());
        let at = |capacity| InPlace {
            mem: mem.clone(),
            addr: GuestAddress(4096),
            capacity,
        };
        let in_place = |a: ReadWriteIn, op, data: &'static [u8], capacity| {
            let mut r = request(op, a.as_bytes(), data);
            r.in_place = Some(at(capacity));
            let action = if op == opcode::READ {
                read(&s, &r)
            } else {
                write(&s, &r)
            };
            submitted(action).0.memory
        };
        let guest_segment = |m: IoMemory| match m {
            IoMemory::Guest { segments, .. } => (segments[0].addr, segments[0].len),
            other => panic!("not in place: {other:?}"),
        };
        let m = in_place(rw(0, 4096), opcode::READ, b"", 4096);
        assert_eq!(guest_segment(m), (GuestAddress(4096), 4096));
        let m = in_place(rw(0, 4), opcode::WRITE, b"abcd", 4096);
        assert_eq!(guest_segment(m), (GuestAddress(4096), 4));
        // Larger than the buffer: a buffer of its own.
        let m = in_place(rw(0, 8192), opcode::READ, b"", 4096);
        assert!(matches!(m, IoMemory::Owned(_) | IoMemory::Aligned(_)));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn writes_need_writable_and_are_cut_or_grow_at_the_end() {
        let (ro, p1) = state("ro", 8192, false, false);
        let arg = rw(0, 4);
        let req = request(opcode::WRITE, arg.as_bytes(), b"abcd");
        assert_eq!(replied(write(&ro, &req)), Reply::Error(libc::EACCES));
        let (rw_state, p2) = state("rw", 8192, true, false);
        let arg = rw(8190, 4);
        let (req, pending) = submitted(write(
            &rw_state,
            &request(opcode::WRITE, arg.as_bytes(), b"abcd"),
        ));
        assert_eq!(req.memory.len(), 2);
        assert_eq!(pending, Pending::Write { size: 2 });
        // Data shorter than the header says: EINVAL, nothing submitted.
        let arg = rw(0, 8);
        assert_eq!(
            replied(write(
                &rw_state,
                &request(opcode::WRITE, arg.as_bytes(), b"abcd")
            )),
            Reply::Error(libc::EINVAL)
        );
        let (grow, p3) = state("grow", 8192, true, true);
        let arg = rw(12288, 4);
        let (req, _) = submitted(write(
            &grow,
            &request(opcode::WRITE, arg.as_bytes(), b"abcd"),
        ));
        assert_eq!(req.memory.len(), 4);
        assert_eq!(grow.size(), 12292);
        for p in [p1, p2, p3] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn fallocate_modes_are_qemus() {
        let (s, path) = state("falloc", 8192, true, false);
        let fa = |offset, length, mode| FallocateIn {
            offset,
            length,
            mode,
            ..Default::default()
        };
        let keep = libc::FALLOC_FL_KEEP_SIZE as u32;
        let punch = libc::FALLOC_FL_PUNCH_HOLE as u32;
        let zero = libc::FALLOC_FL_ZERO_RANGE as u32;
        assert_eq!(
            replied(fallocate(&s, fa(0, 4096, 0).as_bytes())),
            Reply::Error(libc::EOPNOTSUPP)
        );
        assert_eq!(
            replied(fallocate(&s, fa(9000, 1, 0).as_bytes())),
            Reply::Error(libc::EINVAL)
        );
        assert_eq!(
            replied(fallocate(&s, fa(8192, 4096, 0).as_bytes())),
            Reply::Body(vec![])
        );
        assert_eq!(s.size(), 12288);
        assert_eq!(
            replied(fallocate(&s, fa(0, 4096, punch).as_bytes())),
            Reply::Error(libc::EINVAL)
        );
        let (req, _) = submitted(fallocate(&s, fa(4096, 1 << 20, punch | keep).as_bytes()));
        assert_eq!(
            req.op,
            RequestOp::WriteZeroes {
                len: 8192,
                may_unmap: true
            }
        );
        let (req, _) = submitted(fallocate(&s, fa(12288, 4096, zero).as_bytes()));
        assert_eq!(s.size(), 16384);
        assert_eq!(
            req.op,
            RequestOp::WriteZeroes {
                len: 4096,
                may_unmap: false
            }
        );
        assert_eq!(
            replied(fallocate(&s, fa(0, 1, 0x40).as_bytes())),
            Reply::Error(libc::EOPNOTSUPP)
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn lseek_answers_past_the_end_and_refuses_other_whences() {
        let (s, path) = state("lseek", 8192, false, false);
        let ls = |offset, whence: i32| LseekIn {
            offset,
            whence: whence as u32,
            ..Default::default()
        };
        assert_eq!(
            lseek(&s, ls(8192, libc::SEEK_DATA).as_bytes()),
            Reply::Error(libc::ENXIO)
        );
        assert_eq!(
            lseek(&s, ls(9000, libc::SEEK_HOLE).as_bytes()),
            Reply::Body(LseekOut { offset: 9000 }.as_bytes().to_vec())
        );
        assert_eq!(
            lseek(&s, ls(0, libc::SEEK_SET).as_bytes()),
            Reply::Error(libc::EINVAL)
        );
        std::fs::remove_file(path).unwrap();
    }
}
