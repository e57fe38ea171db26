//! Which files' writes the uring engine makes with `pwritev` in the
//! queue's own thread instead of handing them to the ring (once the
//! queue's owner allows it).
//!
//! io_uring makes a buffered write (a file opened without O_DIRECT) in
//! the submitting call only where the file system writes to the page
//! cache without blocking on request (the kernel's `FOP_BUFFER_WASYNC`:
//! XFS, btrfs, bcachefs and block devices). Everywhere else (ext4, tmpfs,
//! NFS, FUSE, ...) it hands every buffered write to an io-wq worker
//! thread, which wakes, copies into the page cache, posts the completion
//! and sleeps again. io-wq runs one ring's buffered writes to one file
//! one at a time (its work is hashed by inode), so the hand-off buys the
//! queue no write concurrency; it only adds two thread switches and a
//! wake-up per write. Measured under the test guest (4 KiB random writes
//! at depth 16 over 2 queues into an allocated qcow2 on ext4, buffered,
//! `perf record` of the whole VMM): through io-wq 35 us of CPU per
//! request, 9 us of it switching threads, at 17.8k IOPS; the same writes
//! made in the queue's thread 24 us at 20.9k IOPS, as much as upstream
//! Cloud Hypervisor's synchronous queue threads (24 us, 20.9k).
//!
//! Reads stay in the ring, which serves page-cache hits in the call and
//! misses without a thread (task work); so do flushes and fallocate,
//! which can take milliseconds while the queue keeps serving. tmpfs
//! reads, which io_uring also hands to io-wq, were tried in the queue's
//! thread: with blk-bench (4 KiB random reads QD 32, 3 interleaved
//! repeats against fio) CPU per request fell to 0.86 x fio's at one
//! queue but IOPS to 0.75 x (0.98 x through io-wq), and at two queues
//! CPU rose to 1.08-1.10 x at 0.62 x the IOPS (1.02-1.05 x, 0.80-0.85 x):
//! on tmpfs the io-wq copy runs beside the queue's thread.
//!
//! Enters as the engine's files; leaves as one flag per file.

use std::borrow::Borrow;
use std::fs::File;
use std::os::fd::AsRawFd;

/// `statfs` magic numbers of the file systems that take buffered writes
/// without blocking (io_uring then writes them in the submitting call).
const NONBLOCKING_BUFFERED_WRITES: [i64; 3] = [
    0x5846_5342, // XFS
    0x9123_683E, // btrfs
    0xca45_1a4e, // bcachefs
];

/// For each of `files`, what the engine makes in the queue's thread
/// (module docs). A file the kernel will not describe keeps the ring.
pub(super) fn inline_write_files(files: &[impl Borrow<File>]) -> Vec<bool> {
    files.iter().map(|f| for_file(f.borrow())).collect()
}

fn for_file(file: &File) -> bool {
    // SAFETY: F_GETFL on a descriptor the caller keeps open; no memory.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    let buffered = flags >= 0 && flags & libc::O_DIRECT == 0;
    let regular = file.metadata().is_ok_and(|m| m.is_file());
    buffered
        && regular
        && fs_type(file).is_some_and(|fs| !NONBLOCKING_BUFFERED_WRITES.contains(&fs))
}

/// The `statfs` magic number of `file`'s file system.
fn fs_type(file: &File) -> Option<i64> {
    // SAFETY: an all-zero statfs is a valid value of the plain C struct.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fs` is a valid statfs the call fills; the descriptor is open.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return None;
    }
    Some(fs.f_type as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    fn check_dir(dir: &std::path::Path) {
        let path = dir.join(format!("inline-writes-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let buffered = File::options().read(true).write(true).open(&path).unwrap();
        let fs = fs_type(&buffered).unwrap();
        let direct = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        let mut files = vec![buffered];
        if let Ok(d) = direct {
            files.push(d);
        }
        let io = inline_write_files(&files);
        let writes = !NONBLOCKING_BUFFERED_WRITES.contains(&fs);
        assert_eq!(io[0], writes, "{fs:#x}");
        // tmpfs refuses O_DIRECT on older kernels; elsewhere it keeps the ring.
        if let Some(d) = io.get(1) {
            assert!(!*d, "O_DIRECT keeps the ring");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_file_system_and_o_direct_decide() {
        check_dir(&std::env::temp_dir());
        check_dir(std::path::Path::new("/var/tmp"));
        if std::path::Path::new("/dev/shm").is_dir() {
            check_dir(std::path::Path::new("/dev/shm"));
        }
        // A device is no regular file: it keeps the ring.
        let null = File::open("/dev/null").unwrap();
        assert_eq!(inline_write_files(&[null]), vec![false]);
    }
}
