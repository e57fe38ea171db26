//! Synchronous data I/O for ch-img through the block crate's queue.
//!
//! ch-img reads and writes an image one request at a time: each call
//! becomes one request with an owned buffer, run to completion on a
//! sync-engine [`DiskQueue`] by the block crate's blocking helper
//! ([`DiskQueue::run`]); the data leaves in the
//! caller's buffer (reads) or in the image (writes). `bench` drives its own
//! queue with many requests in flight instead.
//!
//! Every image is opened as its owner ([`block::ExclusiveImage`]): the
//! tool capabilities (snapshots, backing edits, compressed writes,
//! make-empty) come from [`ImageIo::tools`], called between requests, and
//! [`ImageIo::resize`] goes through the image's [`block::Resizer`].
//!
//! The cache mode the image was opened in is honoured here: O_DIRECT was
//! set at open (the engine bounces unaligned requests); a mode without a
//! volatile write cache (writethrough, directsync) flushes after every
//! write before it returns; `unsafe` skips the flushes, also at close.

use std::cell::RefCell;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use block::aligned::AlignedBuf;
use block::create::FileIdentity;
use block::formats::format::status_within;
use block::formats::{BlockStatus, Format, ImageTools};

use crate::error::CliError;
use block::options::CacheMode;
use block::{BlockError, DiskOptions, DiskQueue, EngineKind, ExclusiveImage, IoMemory, RequestOp};

/// An image ch-img opened as its owner, and the queue it runs its
/// requests on.
pub struct ImageIo {
    image: ExclusiveImage,
    queue: RefCell<DiskQueue>,
    cache: CacheMode,
}

impl ImageIo {
    /// Opens the image in cache mode `cache`, which the block crate sees
    /// too (`opts.cache`, `opts.direct`): O_DIRECT, and with `unsafe` no
    /// fdatasync anywhere, the format's ordering barriers included (an
    /// image opened with the default mode would sync the whole page
    /// cache at each new L2 table of a `-t unsafe` convert).
    pub fn open(opts: &DiskOptions, cache: CacheMode) -> Result<Self, BlockError> {
        let mut opts = opts.clone();
        opts.cache = cache;
        opts.direct = cache.direct();
        let image = ExclusiveImage::open(&opts)?;
        let queue = RefCell::new(image.disk().queue_with_engine(EngineKind::Sync)?);
        Ok(ImageIo {
            image,
            queue,
            cache,
        })
    }

    /// The queue-facing format: `info`, `name`, block status.
    pub fn format(&self) -> &Arc<dyn Format> {
        self.image.disk().format()
    }

    /// The image's tool capabilities (snapshots, backing edits,
    /// compressed writes, make-empty); ch-img has no other request in
    /// flight when it calls them.
    pub fn tools(&self) -> &dyn ImageTools {
        self.image.tools()
    }

    /// Every file the image reads (its own, its data file, its backing
    /// chain's), by device and inode: what a new output must not be
    /// ([`block::create::CreateOptions::sources`]), and how `info` finds
    /// a chain that loops.
    pub fn file_identities(&self) -> Vec<FileIdentity> {
        self.format()
            .files()
            .local()
            .iter()
            .filter_map(|f| FileIdentity::of(f).ok())
            .collect()
    }

    /// The opened disk (convert's write-behind queue is another queue on it).
    pub fn disk(&self) -> &block::Disk {
        self.image.disk()
    }

    pub fn cache_mode(&self) -> CacheMode {
        self.cache
    }

    pub fn size(&self) -> u64 {
        self.image.disk().size()
    }

    /// Fills `buf` with the virtual disk's bytes at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let mem = self.run(RequestOp::Read, offset, IoMemory::Owned(vec![0; buf.len()]))?;
        match mem.into_owned() {
            Some(data) if data.len() == buf.len() => {
                buf.copy_from_slice(&data);
                Ok(())
            }
            _ => Err(BlockError::OutOfRange {
                offset,
                len: buf.len() as u64,
                size: self.size(),
            }),
        }
    }

    /// Reads `buf.len()` bytes at `offset` into `buf` itself (no copy)
    /// and returns it.
    pub fn read_owned(&self, offset: u64, buf: Vec<u8>) -> Result<Vec<u8>, BlockError> {
        let len = buf.len();
        let mem = self.run(RequestOp::Read, offset, IoMemory::Owned(buf))?;
        match mem.into_owned() {
            Some(data) if data.len() == len => Ok(data),
            _ => Err(BlockError::OutOfRange {
                offset,
                len: len as u64,
                size: self.size(),
            }),
        }
    }

    /// Reads `buf.len()` bytes at `offset` into the aligned buffer's
    /// window and returns the buffer: no copy, and an O_DIRECT image
    /// reads straight into it.
    pub fn read_into(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf, BlockError> {
        let len = buf.len();
        match self.run(RequestOp::Read, offset, IoMemory::Aligned(buf))? {
            IoMemory::Aligned(buf) if buf.len() == len => Ok(buf),
            _ => Err(BlockError::LostCompletion),
        }
    }

    /// Writes the aligned buffer's window at `offset` (no copy, in any
    /// cache mode) and returns the buffer; durable on return in
    /// writethrough and directsync modes.
    pub fn write_from(&self, offset: u64, buf: AlignedBuf) -> Result<AlignedBuf, BlockError> {
        let memory = self.run(RequestOp::Write, offset, IoMemory::Aligned(buf))?;
        self.write_done()?;
        match memory {
            IoMemory::Aligned(buf) => Ok(buf),
            _ => Err(BlockError::LostCompletion),
        }
    }

    /// Writes `data` at `offset` (allocating as the format needs).
    /// In writethrough and directsync modes the data is durable on return.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), BlockError> {
        // Only O_DIRECT needs aligned memory; a buffered write copies
        // into the page cache from anywhere.
        let memory = if self.cache.direct() {
            aligned_copy(data)
        } else {
            IoMemory::Owned(data.to_vec())
        };
        self.run(RequestOp::Write, offset, memory)?;
        self.write_done()
    }

    /// Writes one cluster at `offset` that `packed` holds compressed with
    /// the image's algorithm (`block::formats::compress_cluster`).
    pub fn write_packed(&self, offset: u64, packed: &[u8]) -> Result<(), BlockError> {
        self.tools().write_compressed_packed(offset, packed)?;
        self.write_done()
    }

    /// After a write: makes it durable when the cache mode has no
    /// volatile write cache.
    fn write_done(&self) -> Result<(), BlockError> {
        if self.cache.writeback() {
            return Ok(());
        }
        self.flush()
    }

    /// Starts the kernel writing the image file's dirty pages to the disk,
    /// without waiting, in a buffered mode that flushes (writeback,
    /// writethrough): the flushes the format makes on its own and the
    /// last one then find most of the data written already, while the
    /// disk worked in parallel with the copy. Nothing in O_DIRECT modes
    /// (no dirty pages) or `unsafe` (nothing waits for the disk).
    pub fn start_writeback(&self) {
        if self.cache.direct() || !self.cache.flushes() {
            return;
        }
        let Some(file) = self.format().files().local().first() else {
            return;
        };
        // SAFETY: a plain syscall on a file descriptor the image keeps
        // open; it touches no memory of ours. An error (a file type that
        // does not support it) is ignored: this is advice, and a failed
        // write shows at the next flush.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }

    /// Asks the kernel to start reading the data of `offset..offset+len`
    /// of a raw image into the page cache (POSIX_FADV_WILLNEED), so a
    /// read there later finds it: convert's workers read chunks in turn,
    /// each through its own handle, which the kernel's readahead does not
    /// see as one sequential stream. Only the extents with data: advice
    /// over a hole makes the kernel fill the page cache with zero pages
    /// that nothing reads (a 1 GiB source a quarter full: 0.37 s of
    /// system time in fadvise, qemu-img's whole convert 0.17 s). Nothing
    /// for other formats (their host offsets differ) or O_DIRECT (no page
    /// cache).
    pub fn will_need(&self, offset: u64, len: u64) {
        if self.cache.direct() || self.format().name() != "raw" {
            return;
        }
        let Some(file) = self.format().files().local().first() else {
            return;
        };
        let end = offset.saturating_add(len);
        let mut pos = offset;
        while pos < end {
            let Ok(status) = self.format().block_status(pos, end - pos) else {
                return;
            };
            let n = status.len.min(end - pos);
            if n == 0 {
                return;
            }
            if let (false, Ok(at), Ok(n)) = (status.zero, i64::try_from(pos), i64::try_from(n)) {
                // SAFETY: a plain syscall on a file descriptor the image
                // keeps open; it touches no memory of ours. Its result is
                // advice only: the read itself reports any error.
                unsafe {
                    libc::posix_fadvise(file.as_raw_fd(), at, n, libc::POSIX_FADV_WILLNEED);
                }
            }
            pos += n;
        }
    }

    /// Makes every completed write durable (nothing in `unsafe` mode).
    pub fn flush(&self) -> Result<(), BlockError> {
        if !self.cache.flushes() {
            return Ok(());
        }
        self.run(RequestOp::Flush, 0, IoMemory::None).map(|_| ())
    }

    /// The block status of the extent starting at `pos`, cut at `end`. A
    /// zero-length answer is an error: a walk over extents would not move.
    pub fn extent_at(&self, pos: u64, end: u64) -> Result<BlockStatus, CliError> {
        status_within(self.format().as_ref(), pos, end).map_err(|source| CliError::BlockStatus {
            offset: pos,
            source,
        })
    }

    /// Makes `offset..offset+len` read as zeroes (a qcow2 v3 image keeps a
    /// zero cluster for it, as qemu-img commit leaves one); `may_unmap`
    /// lets the image free the clusters instead where nothing would show
    /// through (qemu-img convert -n zeroes its target so).
    pub fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<(), BlockError> {
        self.run(
            RequestOp::WriteZeroes { len, may_unmap },
            offset,
            IoMemory::None,
        )?;
        self.write_done()
    }

    /// Sets the virtual size to `new_size`; a grown area reads as zeroes
    /// even over a longer backing file ([`block::Resizer::resize`]).
    pub fn resize(&self, new_size: u64) -> Result<(), CliError> {
        self.image
            .resizer()
            .resize(new_size)
            .map_err(CliError::Resize)?;
        self.write_done().map_err(CliError::Resize)
    }

    /// Runs `op` (tool calls and requests on this image); if it fails,
    /// the image file is put back as it was before
    /// ([`block::formats::FailureUndo`]) and `op`'s error returned, so a
    /// failed command leaves the image as it was.
    pub fn undo_on_failure<T>(
        &self,
        op: impl FnOnce() -> Result<T, CliError>,
    ) -> Result<T, CliError> {
        let mut op = Some(op);
        let mut outcome = None;
        let undone = self.tools().undo_on_failure(&mut || {
            let Some(op) = op.take() else {
                return Ok(());
            };
            let result = op();
            let failed = result.is_err();
            outcome = Some(result);
            if failed {
                Err(BlockError::Resize("the operation failed".into()))
            } else {
                Ok(())
            }
        });
        match (outcome, undone) {
            (Some(result), _) => result,
            (None, Err(e)) => Err(CliError::Write {
                offset: 0,
                source: e,
            }),
            (None, Ok(())) => Err(CliError::Usage("the operation did not run".into())),
        }
    }

    /// Flushes, then marks the image clean. In `unsafe` mode the metadata
    /// is written but nothing is synced.
    pub fn close(&self) -> Result<(), BlockError> {
        if !self.cache.flushes() {
            return self.format().close();
        }
        self.flush()?;
        self.image.disk().close()
    }

    fn run(&self, op: RequestOp, offset: u64, memory: IoMemory) -> Result<IoMemory, BlockError> {
        let (_, memory) = self.queue.borrow_mut().run(op, offset, memory)?;
        Ok(memory)
    }
}

/// `data` copied into page-aligned memory: an aligned write reaches an
/// O_DIRECT file in one op, without the engine's bounce copy in 1 MiB
/// chunks.
pub fn aligned_copy(data: &[u8]) -> IoMemory {
    match AlignedBuf::new(data.len(), 4096) {
        Some(mut buf) => {
            buf.as_mut_slice().copy_from_slice(data);
            IoMemory::Aligned(buf)
        }
        None => IoMemory::Owned(data.to_vec()),
    }
}
