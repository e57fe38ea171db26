//! Data writes of convert's writer that complete in the background, a few
//! at a time, so the writer goes on (packing compressed clusters, taking
//! the next chunk) while the disk writes, and an O_DIRECT target (`-t
//! none`) sees several large writes queued instead of one synchronous
//! write at a time.
//!
//! Writes enter through [`WriteBehind::write`]: each becomes a request on
//! a queue of its own on the output's [`Disk`], on the thread-pool engine.
//! The format plans it (allocates its clusters) at once, in the order of
//! the calls, so the image is laid out as with synchronous writes; the
//! data write runs in the pool, and its L2 entry is published when its
//! completion is drained here. [`WriteBehind::finish`] waits for every one
//! (before the output is flushed or closed). The first failed write is
//! returned, with its offset, by the call that drains it.
//!
//! Only for `-t none` (O_DIRECT, writes that need no flush of their own);
//! buffered targets (writeback, unsafe) and writethrough/directsync write
//! synchronously through [`ImageIo::write_at`].

use block::aligned::AlignedBuf;
use block::{BlockError, BlockRequest, Completion, DiskQueue, EngineKind, IoMemory, RequestOp};

use crate::image_io::{aligned_copy, ImageIo};

/// Writes in flight at most (each up to the writer's joined size).
const MAX_IN_FLIGHT: usize = 4;

/// See the module docs.
pub struct WriteBehind {
    queue: DiskQueue,
    in_flight: usize,
    done: Vec<Completion>,
    cluster_size: u64,
    /// Last cluster of the latest write submitted.
    last_cluster: Option<u64>,
    /// Aligned buffers of finished writes, for the next writes of the same
    /// size: a new one per write cost a page fault per 4 KiB (mix zstd
    /// -t none, 1000 MiB: 74k faults per run).
    free: Vec<AlignedBuf>,
}

impl WriteBehind {
    /// A write-behind queue on `output`, or `None` when its cache mode
    /// makes every write durable before the next.
    pub fn new(output: &ImageIo) -> Result<Option<Self>, BlockError> {
        // Buffered targets: a write is a copy into the page cache, and
        // handing it to a pool thread costs more than it saves (mix zstd
        // -t writeback, 1000 MiB: 1.41 s with the pool, 1.22 s without;
        // docs/performance.md, "Tried and not kept").
        let mode = output.cache_mode();
        if !mode.writeback() || !mode.direct() {
            return Ok(None);
        }
        let queue = output.disk().queue_with_engine(EngineKind::Threads)?;
        let cluster_size = output.format().info().cluster_size.unwrap_or(1).max(1);
        Ok(Some(WriteBehind {
            queue,
            in_flight: 0,
            done: Vec::new(),
            cluster_size,
            last_cluster: None,
            free: Vec::new(),
        }))
    }

    /// Submits a write of `data` at `offset`; waits first while
    /// [`MAX_IN_FLIGHT`] are in flight, or for all of them when this one
    /// shares a cluster with the previous (the format would hold it back
    /// until that one's allocation is published, and a later write could
    /// allocate first: the layout would depend on timing).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), (u64, BlockError)> {
        if data.is_empty() {
            return Ok(());
        }
        let first = offset / self.cluster_size;
        if self.last_cluster.is_some_and(|c| c >= first) {
            self.wait_until(0)?;
        }
        self.wait_until(MAX_IN_FLIGHT - 1)?;
        let memory = match self.free.iter().position(|b| b.len() == data.len()) {
            Some(i) => {
                let mut buf = self.free.swap_remove(i);
                buf.as_mut_slice().copy_from_slice(data);
                IoMemory::Aligned(buf)
            }
            None => aligned_copy(data),
        };
        self.queue.submit_batch_requests([BlockRequest {
            user_data: offset,
            op: RequestOp::Write,
            offset,
            memory,
        }]);
        self.in_flight += 1;
        self.last_cluster = Some((offset + data.len() as u64 - 1) / self.cluster_size);
        Ok(())
    }

    /// Waits for every write in flight.
    pub fn finish(&mut self) -> Result<(), (u64, BlockError)> {
        self.wait_until(0)
    }

    /// Drains completions until at most `limit` writes are in flight.
    fn wait_until(&mut self, limit: usize) -> Result<(), (u64, BlockError)> {
        while self.in_flight > limit {
            self.queue
                .wait_completions(&mut self.done)
                .map_err(|e| (0, e))?;
            if self.done.is_empty() && self.queue.in_flight() == 0 {
                return Err((0, BlockError::LostCompletion));
            }
            for c in self.done.drain(..) {
                self.in_flight = self.in_flight.saturating_sub(1);
                if let IoMemory::Aligned(buf) = c.memory {
                    if self.free.len() < MAX_IN_FLIGHT {
                        self.free.push(buf);
                    }
                }
                c.result.map_err(|e| (c.user_data, e))?;
            }
        }
        Ok(())
    }
}
