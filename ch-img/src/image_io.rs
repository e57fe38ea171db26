//! Synchronous data I/O for ch-img through the block crate's queue.
//!
//! ch-img reads and writes an image one request at a time: each call
//! becomes one [`BlockRequest`] with an owned buffer, submitted to a
//! sync-engine [`DiskQueue`] and waited for; the data leaves in the
//! caller's buffer (reads) or in the image (writes). `bench` drives its own
//! queue with many requests in flight instead.
//!
//! The cache mode the image was opened in is honoured here: O_DIRECT was
//! set at open (the engine bounces unaligned requests); a mode without a
//! volatile write cache (writethrough, directsync) flushes after every
//! write before it returns; `unsafe` skips the flushes, also at close.

use std::cell::RefCell;
use std::sync::Arc;

use block::aligned::AlignedBuf;
use block::formats::{BlockStatus, Format};

use crate::error::CliError;
use block::options::CacheMode;
use block::{
    BlockError, BlockRequest, Disk, DiskOptions, DiskQueue, EngineKind, IoMemory, RequestOp,
};

/// An opened image and the queue ch-img runs its requests on.
pub struct ImageIo {
    disk: Disk,
    queue: RefCell<DiskQueue>,
    cache: CacheMode,
}

impl ImageIo {
    /// Opens the image; `opts.direct` must already say what `cache` asks.
    pub fn open(opts: &DiskOptions, cache: CacheMode) -> Result<Self, BlockError> {
        let disk = Disk::open(opts)?;
        let queue = RefCell::new(disk.queue_with_engine(EngineKind::Sync)?);
        Ok(ImageIo { disk, queue, cache })
    }

    pub fn format(&self) -> &Arc<dyn Format> {
        self.disk.format()
    }

    /// The opened disk (convert's write-behind queue is another queue on it).
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    pub fn cache_mode(&self) -> CacheMode {
        self.cache
    }

    pub fn size(&self) -> u64 {
        self.disk.size()
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

    /// Writes `data` at `offset` (allocating as the format needs).
    /// In writethrough and directsync modes the data is durable on return.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), BlockError> {
        self.run(RequestOp::Write, offset, aligned_copy(data))?;
        self.write_done()
    }

    /// Writes one cluster at `offset` that `packed` holds compressed with
    /// the image's algorithm (`block::formats::compress_cluster`).
    pub fn write_packed(&self, offset: u64, packed: &[u8]) -> Result<(), BlockError> {
        self.format().write_compressed_packed(offset, packed)?;
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
        let mut status = self
            .format()
            .block_status(pos, end - pos)
            .map_err(|source| CliError::BlockStatus {
                offset: pos,
                source,
            })?;
        if status.len == 0 {
            return Err(CliError::BlockStatus {
                offset: pos,
                source: BlockError::OutOfRange {
                    offset: pos,
                    len: 0,
                    size: end,
                },
            });
        }
        status.len = status.len.min(end - pos);
        Ok(status)
    }

    /// Makes `offset..offset+len` read as zeroes (a qcow2 v3 image keeps a
    /// zero cluster for it, as qemu-img commit leaves one).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.run(
            RequestOp::WriteZeroes {
                len,
                may_unmap: false,
            },
            offset,
            IoMemory::None,
        )?;
        self.write_done()
    }

    /// Grows the virtual disk to `new_size`. When the backing file is
    /// longer than the old size, the new area is then zeroed, so the
    /// backing file's data there does not show through (qemu-img does the
    /// same; without it an overlay grown over a longer backing file would
    /// read the backing file's bytes where a grown disk must read zeroes).
    pub fn grow(&self, new_size: u64) -> Result<(), CliError> {
        let old = self.size();
        self.format().resize(new_size).map_err(CliError::Resize)?;
        // Like qemu-img, the whole new area is zeroed (its layout then
        // matches), not only the part the backing file covers.
        if self.format().backing_size().is_some_and(|b| b > old) {
            self.write_zeroes(old, new_size - old)
                .map_err(|source| CliError::Write {
                    offset: old,
                    source,
                })?;
        }
        Ok(())
    }

    /// Flushes, then marks the image clean. In `unsafe` mode the metadata
    /// is written but nothing is synced.
    pub fn close(&self) -> Result<(), BlockError> {
        if !self.cache.flushes() {
            return self.format().close();
        }
        self.flush()?;
        self.disk.close()
    }

    fn run(&self, op: RequestOp, offset: u64, memory: IoMemory) -> Result<IoMemory, BlockError> {
        let mut queue = self.queue.borrow_mut();
        queue.submit_batch_requests([BlockRequest {
            user_data: 0,
            op,
            offset,
            memory,
        }]);
        let mut out = Vec::with_capacity(1);
        while out.is_empty() {
            queue.wait_completions(&mut out)?;
            if out.is_empty() && queue.in_flight() == 0 {
                return Err(BlockError::EventFd(std::io::Error::other(
                    "request vanished without a completion",
                )));
            }
        }
        let done = out.swap_remove(0);
        done.result.map(|_| done.memory)
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
