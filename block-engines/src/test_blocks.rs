//! Test fixture shared by the engines' unit tests: a 64 KiB file whose
//! 4 KiB block i holds byte i, and 16 block reads pushed into buffers.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use super::{Engine, HostOp, RawIovecs};
use crate::FileId;

/// Blocks in the fixture file.
pub const BLOCKS: usize = 16;

/// The file, removed on drop.
pub struct BlockFile {
    path: PathBuf,
    pub file: Arc<File>,
}

impl BlockFile {
    pub fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let data: Vec<u8> = (0..BLOCKS as u8).flat_map(|i| vec![i; 4096]).collect();
        std::fs::write(&path, data).unwrap();
        let file = Arc::new(File::options().read(true).write(true).open(&path).unwrap());
        BlockFile { path, file }
    }
}

impl Drop for BlockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Read buffers (0xff until read) and the iovecs over them.
pub struct ReadBuffers {
    pub bufs: Vec<Vec<u8>>,
    iovs: Vec<libc::iovec>,
}

impl ReadBuffers {
    pub fn new() -> Self {
        let mut bufs = vec![vec![0xffu8; 4096]; BLOCKS];
        let iovs = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        ReadBuffers { bufs, iovs }
    }

    /// Pushes one read per block of file 0 under token = block index.
    ///
    /// # Safety
    ///
    /// `self` must outlive every op's completion (reaped, or the engine
    /// dropped, which waits).
    pub unsafe fn push_all(&self, e: &mut dyn Engine) {
        for (i, iov) in self.iovs.iter().enumerate() {
            let op = HostOp::Readv {
                file: FileId(0),
                offset: i as u64 * 4096,
                iov: RawIovecs { ptr: iov, count: 1 },
            };
            // SAFETY: the caller keeps `self` alive until completion.
            unsafe { e.push(i as u64, op).unwrap() };
        }
    }

    /// Whether block i read byte i (for the blocks in `ok`).
    pub fn assert_read(&self, ok: impl Fn(usize) -> bool) {
        for (i, b) in self.bufs.iter().enumerate() {
            if ok(i) {
                assert!(b.iter().all(|&x| x == i as u8), "block {i}");
            }
        }
    }
}
