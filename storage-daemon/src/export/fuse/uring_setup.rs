//! The pieces of FUSE-over-io_uring set-up that need no running queue:
//! how many kernel queues there are (one per possible CPU, read from
//! sysfs), which of them each ring thread serves, the ring each thread
//! owns, and the URING_CMD SQEs (REGISTER, COMMIT_AND_FETCH) that
//! [`super::uring`] pushes.

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use thiserror::Error;

use super::abi::{Pod, UringCmdReq, URING_CMD_REGISTER};

#[derive(Debug, Error)]
pub enum RingError {
    #[error("cannot read the possible CPUs")]
    PossibleCpus(#[source] std::io::Error),
    #[error("cannot create the io_uring of ring thread {0}")]
    Create(u16, #[source] std::io::Error),
    #[error("cannot enable the io_uring of ring thread {0}")]
    Enable(u16, #[source] std::io::Error),
    #[error("cannot open a disk queue for ring thread {0}")]
    DiskQueue(u16, #[source] block::BlockError),
    #[error("ring thread {0}: registering ring entries failed")]
    Submit(u16, #[source] std::io::Error),
    #[error("ring thread {0}: the kernel refused ring entry registration")]
    Register(u16, #[source] std::io::Error),
}

/// Ring threads sharing each kernel queue's entries ([`served_queues`]).
pub const SERVERS_PER_QUEUE: u16 = 2;

/// Parses `/sys/devices/system/cpu/possible` ("0-3", "0,2-5").
fn count_cpus(list: &str) -> Option<u16> {
    let mut n = 0u16;
    for part in list.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u16>().ok()?, b.parse::<u16>().ok()?),
            None => {
                let a = part.parse::<u16>().ok()?;
                (a, a)
            }
        };
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    Some(n)
}

/// The kernel makes one ring queue per possible CPU.
pub fn possible_cpus() -> Result<u16, RingError> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .map_err(RingError::PossibleCpus)?;
    count_cpus(&text).ok_or_else(|| {
        RingError::PossibleCpus(std::io::Error::other(format!(
            "cannot parse '{}'",
            text.trim()
        )))
    })
}

/// A URING_CMD for FUSE on `fd` with the command area `cmd`.
pub fn fuse_cmd(fd: i32, cmd_op: u32, cmd: &UringCmdReq) -> opcode::UringCmd80 {
    let mut area = [0u8; 80];
    area[..std::mem::size_of::<UringCmdReq>()].copy_from_slice(cmd.as_bytes());
    opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(area)
}

/// The REGISTER SQE: `addr` = the two iovecs, `len` = 2. The io-uring
/// crate's UringCmd80 has no `len`, so it is patched into bytes 24..28 of
/// the 128-byte `#[repr(C)]` entry (`struct io_uring_sqe`'s `len`).
pub fn register_sqe(fd: i32, qid: u16, iov: &[libc::iovec; 2], tag: u64) -> squeue::Entry128 {
    let cmd = UringCmdReq {
        qid,
        ..Default::default()
    };
    let entry = fuse_cmd(fd, URING_CMD_REGISTER, &cmd)
        .addr(Some(iov.as_ptr() as u64))
        .build()
        .user_data(tag);
    // SAFETY: Entry128 is #[repr(C)] (a 64-byte io_uring_sqe then 64 bytes
    // of command area), so it and [u8; 128] have the same size and every
    // byte is initialised; the sqe's `len` field is at offset 24.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(entry) };
    bytes[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: the bytes came from a valid Entry128 with one u32 field
    // changed; any value is a valid u32.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

/// The ring of one queue: SQE128 (URING_CMD), room for every entry's
/// command plus the completion poll. Preferably with DEFER_TASKRUN and
/// SINGLE_ISSUER, created disabled so the serving thread can enable it
/// and become its issuer: the kernel then hands requests to the thread
/// only when it waits in `io_uring_enter`, instead of interrupting it
/// with an IPI for each one (`true` in the result). Kernels without those
/// flags (before 6.1) get a plain ring.
pub fn build_ring(
    entries: u32,
) -> std::io::Result<(IoUring<squeue::Entry128, cqueue::Entry>, bool)> {
    let mut builder = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
    builder.setup_cqsize(2 * entries + 2);
    let plain = builder.clone();
    builder
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_r_disabled();
    match builder.build(entries + 2) {
        Ok(ring) => Ok((ring, true)),
        Err(_) => Ok((plain.build(entries + 2)?, false)),
    }
}

/// Which kernel queues ring thread `index` of `queues` serves: its own
/// and the next one (each queue is served by two threads when there are
/// two or more). The kernel puts every request of an application thread
/// on the queue of its CPU; with one thread per queue, one submitting
/// thread (fio at depth 64) is served by one ring thread however busy
/// or preempted it is. With two, a request goes to whichever thread's
/// entry is free (the kernel reuses the most recently committed entry
/// first), and queues stay local to neighbouring threads on big hosts.
pub fn served_queues(index: u16, queues: u16) -> Vec<u16> {
    let servers = queues.min(SERVERS_PER_QUEUE);
    (0..servers).map(|k| (index + k) % queues).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpu_lists_are_counted() {
        assert_eq!(count_cpus("0-1\n"), Some(2));
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("0,2-5"), Some(5));
        assert_eq!(count_cpus("x"), None);
        assert_eq!(count_cpus("5-2"), None);
    }

    #[test]
    fn each_queue_is_served_by_two_threads() {
        assert_eq!(served_queues(0, 1), vec![0]);
        assert_eq!(served_queues(0, 2), vec![0, 1]);
        assert_eq!(served_queues(1, 2), vec![1, 0]);
        assert_eq!(served_queues(3, 4), vec![3, 0]);
        for queues in 1..9u16 {
            let mut servers = vec![0; usize::from(queues)];
            for t in 0..queues {
                for q in served_queues(t, queues) {
                    servers[usize::from(q)] += 1;
                }
            }
            assert!(servers.iter().all(|&n| n == queues.min(2)), "{servers:?}");
        }
    }

    #[test]
    fn register_sqe_carries_two_iovecs() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = register_sqe(7, 3, &iov, 9);
        // SAFETY: reading the bytes of a #[repr(C)] 128-byte entry.
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(bytes[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(i32::from_ne_bytes(bytes[4..8].try_into().unwrap()), 7);
        assert_eq!(
            u64::from_ne_bytes(bytes[16..24].try_into().unwrap()),
            iov.as_ptr() as u64
        );
        assert_eq!(u32::from_ne_bytes(bytes[24..28].try_into().unwrap()), 2);
        // cmd_op (offset 8) and the qid in the command area (offset 48+16).
        assert_eq!(
            u32::from_ne_bytes(bytes[8..12].try_into().unwrap()),
            URING_CMD_REGISTER
        );
        assert_eq!(u16::from_ne_bytes(bytes[64..66].try_into().unwrap()), 3);
        assert_eq!(u64::from_ne_bytes(bytes[32..40].try_into().unwrap()), 9);
    }
}
