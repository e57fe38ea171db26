//! Data writes of convert's writer that complete in the background, a few
//! at a time, so the writer goes on (packing compressed clusters, taking
//! the next chunk) while the disk writes, and an O_DIRECT target (`-t
//! none`) sees several large writes queued instead of one synchronous
//! write at a time.
//!
//! Writes enter through [`WriteBehind::submit`], an aligned buffer of the
//! copy's pool whose window is the data (no copy): each becomes a request
//! on a queue of its own on the output's [`Disk`], on the thread-pool
//! engine. The format plans it (allocates its clusters)
//! at once, in the order of the calls, so the image is laid out as with
//! synchronous writes; the data write runs in the pool, and its L2 entry
//! is published when its completion is drained here. Pool buffers come
//! back through [`WriteBehind::returned`] once written.
//! [`WriteBehind::finish`] waits for every write (before the output is
//! flushed or closed). The first failed write is returned, with its
//! offset, by the call that drains it.
//!
//! Only for `-t none` (O_DIRECT, writes that need no flush of their own);
//! buffered targets (writeback, unsafe) and writethrough/directsync write
//! synchronously through [`ImageIo::write_from`].
//!
//! [`Disk`]: block::Disk

use block::aligned::AlignedBuf;
use block::{BlockError, BlockRequest, Completion, DiskQueue, EngineKind, IoMemory, RequestOp};

use crate::image_io::ImageIo;

/// Writes in flight at most.
const MAX_IN_FLIGHT: usize = 4;

/// A write in flight: its request id and disk offset.
struct InFlight {
    id: u64,
    offset: u64,
}

/// See the module docs.
pub struct WriteBehind {
    queue: DiskQueue,
    in_flight: Vec<InFlight>,
    next_id: u64,
    done: Vec<Completion>,
    cluster_size: u64,
    /// Last cluster of the latest write submitted.
    last_cluster: Option<u64>,
    /// Buffers whose writes completed, for the caller to take back.
    returned: Vec<AlignedBuf>,
}

impl WriteBehind {
    /// Whether `output`'s cache mode gets a write-behind queue: O_DIRECT
    /// writes that need no flush of their own. Buffered targets: a write
    /// is a copy into the page cache, and handing it to a pool thread
    /// costs more than it saves (mix zstd -t writeback, 1000 MiB: 1.41 s
    /// with the pool, 1.22 s without; docs/performance.md, "Tried and not
    /// kept").
    pub fn used_for(output: &ImageIo) -> bool {
        let mode = output.cache_mode();
        mode.writeback() && mode.direct()
    }

    /// A write-behind queue on `output`, or `None` when it gets none
    /// ([`WriteBehind::used_for`]).
    pub fn new(output: &ImageIo) -> Result<Option<Self>, BlockError> {
        if !Self::used_for(output) {
            return Ok(None);
        }
        let queue = output.disk().queue_with_engine(EngineKind::Threads)?;
        let cluster_size = output.format().info().cluster_size.unwrap_or(1).max(1);
        Ok(Some(WriteBehind {
            queue,
            in_flight: Vec::new(),
            next_id: 0,
            done: Vec::new(),
            cluster_size,
            last_cluster: None,
            returned: Vec::new(),
        }))
    }

    /// Submits a write of `buf`'s window at `offset`; the buffer comes
    /// back through [`WriteBehind::returned`] when the write is done.
    pub fn submit(&mut self, offset: u64, buf: AlignedBuf) -> Result<(), (u64, BlockError)> {
        if buf.is_empty() {
            self.returned.push(buf);
            return Ok(());
        }
        let len = buf.len() as u64;
        self.make_room(offset)?;
        let id = self.next_id;
        self.next_id += 1;
        self.queue.submit_batch_requests([BlockRequest {
            user_data: id,
            op: RequestOp::Write,
            offset,
            memory: IoMemory::Aligned(buf),
        }]);
        self.in_flight.push(InFlight { id, offset });
        self.last_cluster = Some((offset + len - 1) / self.cluster_size);
        Ok(())
    }

    /// Pool buffers whose writes are done (their windows as submitted).
    pub fn returned(&mut self) -> std::vec::Drain<'_, AlignedBuf> {
        self.returned.drain(..)
    }

    /// Waits for every write in flight.
    pub fn finish(&mut self) -> Result<(), (u64, BlockError)> {
        self.wait_until(0)
    }

    /// Before a write at `offset`: waits while [`MAX_IN_FLIGHT`] are in
    /// flight, or for all of them when it shares a cluster with the
    /// previous (the format would hold it back until that one's
    /// allocation is published, and a later write could allocate first:
    /// the layout would depend on timing).
    fn make_room(&mut self, offset: u64) -> Result<(), (u64, BlockError)> {
        let first = offset / self.cluster_size;
        if self.last_cluster.is_some_and(|c| c >= first) {
            self.wait_until(0)?;
        }
        self.wait_until(MAX_IN_FLIGHT - 1)
    }

    /// Drains completions until at most `limit` writes are in flight.
    fn wait_until(&mut self, limit: usize) -> Result<(), (u64, BlockError)> {
        while self.in_flight.len() > limit {
            self.queue
                .wait_completions(&mut self.done)
                .map_err(|e| (0, e))?;
            if self.done.is_empty() && self.queue.in_flight() == 0 {
                return Err((0, BlockError::LostCompletion));
            }
            let mut failed = None;
            for c in self.done.drain(..) {
                let Some(i) = self.in_flight.iter().position(|w| w.id == c.user_data) else {
                    failed.get_or_insert((0, BlockError::LostCompletion));
                    continue;
                };
                let w = self.in_flight.swap_remove(i);
                if let IoMemory::Aligned(buf) = c.memory {
                    self.returned.push(buf);
                }
                if let Err(e) = c.result {
                    failed.get_or_insert((w.offset, e));
                }
            }
            if let Some(f) = failed {
                return Err(f);
            }
        }
        Ok(())
    }
}
