//! convert's copy: `-m` workers read (and with `-c` compress) chunks of
//! the source concurrently; the calling thread writes them to the output.
//!
//! The virtual disk is cut into chunks, numbered in disk order (2 MiB,
//! or 16 clusters with `-c`; without `-c` a boundary moves past a short
//! data extent that would straddle it, [`crate::chunk_bounds`]). A worker
//! takes the next number together with an aligned buffer from a fixed
//! pool ([`Window`]), reads the chunk into it through its own handle on
//! the source (ranges `block_status` reports as zero are not read), and
//! sends the pieces to write ([`crate::chunk_pieces`]), which name ranges
//! of that buffer. The writer writes chunks in disk order (so a `-c`
//! output is laid out exactly as a serial run's) or, with `-W`, as they
//! arrive, straight from the buffer (no copy), and gives the buffer back
//! to the pool. The pool bounds memory (`-m` + 2 buffers of a chunk) and
//! nothing is allocated per chunk;
//! workers also stay at most a window of chunks ahead of the writer, so
//! a run of empty chunks cannot pile up results. Bytes the source lost to
//! damage are reported in disk order on stderr and converted as zeroes.
//! The first error stops everything and is returned.
//!
//! Why it cannot stall: a worker takes a chunk number only together with
//! a buffer, so the chunk the writer waits for is always being read; and
//! before the writer waits for a chunk it takes back every buffer the
//! write-behind queue holds, so buffers are only ever held by chunks
//! being read, waiting for their turn, or being written.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};

use block::aligned::AlignedBuf;
use block::BlockError;

use crate::chunk_bounds::{chunk_range, max_shift};
use crate::chunk_fill::{filled_pieces, read_filled, Fill};
use crate::chunk_pieces::{pieces_of, read_chunk, Lost, Piece, ReadChunk};
use crate::convert_source::ConvertSource;
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::progress::Progress;
use crate::write_behind::WriteBehind;

pub use crate::chunk_pieces::Mode;

/// Bytes per chunk without `-c` (with `-c`: 16 clusters).
const CHUNK: u64 = 2 << 20;

/// Chunks written between two [`ImageIo::start_writeback`] calls.
const WRITEBACK_EVERY: u64 = 16;

/// What a convert copies and how.
pub struct Job<'a> {
    /// Opens one handle on the source (each worker has its own).
    pub open_source: &'a (dyn Fn() -> Result<ConvertSource, CliError> + Sync),
    pub output: &'a ImageIo,
    /// Names the output in write errors.
    pub output_path: &'a str,
    pub size: u64,
    pub mode: Mode,
    /// What the output needs besides the data (zeroes, its backing file).
    pub fill: Fill,
    pub workers: usize,
    pub in_order: bool,
    /// Chunk boundaries may move past short extents
    /// ([`crate::chunk_bounds`]; never with `-c`): it asks the source for
    /// each chunk's extents twice more.
    pub extent_bounds: bool,
}

/// The hand-out of chunk numbers and of the buffers they are read into.
struct Window {
    state: Mutex<Hand>,
    moved: Condvar,
    stop: AtomicBool,
    /// Chunks a worker may take beyond the last one written.
    ahead: u64,
    /// Bytes per buffer (one chunk).
    buffer_len: usize,
}

/// What [`Window`] guards.
struct Hand {
    next: u64,
    written: u64,
    free: Vec<AlignedBuf>,
    /// Buffers the pool may still allocate.
    unmade: usize,
}

impl Window {
    fn new(buffers: usize, buffer_len: usize) -> Self {
        Window {
            state: Mutex::new(Hand {
                next: 0,
                written: 0,
                free: Vec::new(),
                unmade: buffers,
            }),
            moved: Condvar::new(),
            stop: AtomicBool::new(false),
            ahead: 2 * buffers as u64,
            buffer_len,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hand> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next chunk and the buffer to read it into: `kept` (a worker's
    /// buffer that the writer did not need), else one of the pool's,
    /// waiting while they are all in use or the writer is too far behind.
    /// `None` when no chunk is left or the copy stopped.
    fn take(
        &self,
        chunks: u64,
        mut kept: Option<AlignedBuf>,
    ) -> Result<Option<(u64, AlignedBuf)>, BlockError> {
        let mut hand = self.lock();
        loop {
            if self.stop.load(Ordering::Relaxed) || hand.next >= chunks {
                if let Some(buf) = kept {
                    hand.free.push(buf);
                }
                return Ok(None);
            }
            if hand.next < hand.written + self.ahead {
                let buf = match kept.take().or_else(|| hand.free.pop()) {
                    Some(buf) => Some(buf),
                    None if hand.unmade > 0 => {
                        hand.unmade -= 1;
                        let made = AlignedBuf::new_mapped(self.buffer_len);
                        Some(made.ok_or(BlockError::BufferAlloc(self.buffer_len))?)
                    }
                    None => None,
                };
                if let Some(buf) = buf {
                    hand.next += 1;
                    if hand.next == chunks {
                        // Workers waiting for a buffer: nothing is left.
                        self.moved.notify_all();
                    }
                    return Ok(Some((hand.next - 1, buf)));
                }
            }
            hand = self.moved.wait(hand).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A buffer back into the pool (its whole window shown again).
    fn give(&self, mut buf: AlignedBuf) {
        buf.full_window();
        self.lock().free.push(buf);
        self.moved.notify_one();
    }

    /// One more chunk written: a worker may take one more.
    fn advance(&self) {
        self.lock().written += 1;
        self.moved.notify_one();
    }

    fn halt(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _guard = self.lock();
        self.moved.notify_all();
    }
}

/// Runs the copy, reporting progress.
pub fn run(job: &Job, progress: &mut Progress) -> Result<(), CliError> {
    let chunk = match job.mode {
        Mode::Sparse { .. } => CHUNK,
        Mode::Compressed { cluster_size, .. } => cluster_size * 16,
    };
    let chunks = job.size.div_ceil(chunk);
    let workers = job.workers.clamp(1, 16);
    // One buffer per worker, one being written, one for the next chunk
    // in disk order while the others wait. The write-behind queue's
    // writes in flight hold buffers of these too (on an O_DIRECT target
    // the disk is the bound, and readers can wait); the writer takes them
    // back before it waits for a chunk (`write_all`).
    let buffers = workers + 2;
    // Without -c a chunk may reach past its place on the grid.
    let movable = job.extent_bounds && matches!(job.mode, Mode::Sparse { .. });
    let capacity = chunk + if movable { max_shift(chunk) } else { 0 };
    let window = Window::new(buffers, capacity as usize);
    let (tx, rx) = mpsc::channel::<ChunkResult>();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let tx = tx.clone();
            let reader = Reader {
                open_source: job.open_source,
                size: job.size,
                mode: job.mode,
                fill: job.fill,
                chunk,
                chunks,
                movable,
                window: &window,
                readahead: workers as u64,
            };
            scope.spawn(move || reader.work(&tx));
        }
        drop(tx);
        let result = write_all(job, chunk, chunks, &rx, &window, progress);
        window.halt();
        result
    })
}

/// What a worker needs (the output stays with the writer).
struct Reader<'a> {
    open_source: &'a (dyn Fn() -> Result<ConvertSource, CliError> + Sync),
    size: u64,
    mode: Mode,
    fill: Fill,
    chunk: u64,
    chunks: u64,
    /// Chunk boundaries may move ([`crate::chunk_bounds`]).
    movable: bool,
    window: &'a Window,
    /// Chunks ahead of its own that a worker asks the kernel to read.
    readahead: u64,
}

/// One chunk for the writer: the buffer its data pieces name (none when
/// it has no data piece), the pieces, and the bytes lost to damage.
struct ChunkOut {
    buf: Option<AlignedBuf>,
    pieces: Vec<Piece>,
    lost: Vec<Lost>,
}

/// A chunk's number and what to write, from a worker to the writer.
type ChunkResult = (u64, Result<ChunkOut, CliError>);

impl Reader<'_> {
    fn work(self, tx: &mpsc::Sender<ChunkResult>) {
        let source = match (self.open_source)() {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send((0, Err(e)));
                return;
            }
        };
        let mut kept = None;
        loop {
            let (i, buf) = match self.window.take(self.chunks, kept.take()) {
                Ok(Some(next)) => next,
                Ok(None) => return,
                Err(source) => {
                    let _ = tx.send((0, Err(CliError::Read { offset: 0, source })));
                    return;
                }
            };
            // The chunk the workers take after the ones being read now.
            let ahead = (i * self.chunk).saturating_add(self.readahead.saturating_mul(self.chunk));
            if ahead < self.size {
                source.will_need(ahead, self.chunk.min(self.size - ahead));
            }
            let range = chunk_range(&source, i, self.chunk, self.size, self.movable);
            let out = range.and_then(|r| self.chunk_out(&source, r.start, r.end - r.start, buf));
            let out = out.map(|mut out| {
                if !out.pieces.iter().any(|p| matches!(p, Piece::Data { .. })) {
                    kept = out.buf.take();
                }
                out
            });
            let failed = out.is_err();
            if tx.send((i, out)).is_err() || failed {
                return;
            }
        }
    }

    /// Reads one chunk into `buf` and makes its pieces.
    fn chunk_out(
        &self,
        source: &ConvertSource,
        start: u64,
        len: u64,
        buf: AlignedBuf,
    ) -> Result<ChunkOut, CliError> {
        let n = len as usize;
        let (mut read, pieces): (ReadChunk, _) = if self.fill == Fill::PLAIN {
            let mut read = read_chunk(source, start, len, buf)?;
            let pieces = pieces_of(self.mode, start, n, &mut read)?;
            (read, pieces)
        } else {
            let (mut read, spans) = read_filled(source, start, len, buf, self.fill, self.mode)?;
            let pieces = filled_pieces(self.mode, start, n, &mut read, &spans)?;
            (read, pieces)
        };
        Ok(ChunkOut {
            buf: Some(read.buf),
            pieces,
            lost: std::mem::take(&mut read.lost),
        })
    }
}

/// The writer: chunk results in disk order (or as they come with `-W`).
fn write_all(
    job: &Job,
    chunk: u64,
    chunks: u64,
    rx: &mpsc::Receiver<ChunkResult>,
    window: &Window,
    progress: &mut Progress,
) -> Result<(), CliError> {
    let mut waiting: BTreeMap<u64, ChunkOut> = BTreeMap::new();
    let behind = WriteBehind::new(job.output).map_err(|source| CliError::WriteOutput {
        path: job.output_path.into(),
        offset: 0,
        source,
    })?;
    let mut out = ChunkWriter {
        job,
        behind,
        window,
        lost: LostReport::default(),
    };
    let mut next = 0u64;
    let mut written = 0u64;
    // After each chunk written: the window, the output's writeback, progress.
    let mut chunk_done = |written: u64| {
        window.advance();
        if written.is_multiple_of(WRITEBACK_EVERY) {
            job.output.start_writeback();
        }
        progress.update((written * chunk).min(job.size));
    };
    while written < chunks {
        let received = match rx.try_recv() {
            Err(mpsc::TryRecvError::Empty) => {
                // Nothing to write yet: the write-behind queue's buffers
                // go back to the pool before this thread sleeps, or a
                // worker waiting for one would wait for ever.
                out.finish_behind()?;
                rx.recv().ok()
            }
            other => other.ok(),
        };
        let Some((i, result)) = received else {
            return Err(CliError::Usage("convert workers stopped early".into()));
        };
        let c = result?;
        if job.in_order {
            waiting.insert(i, c);
            while let Some(c) = waiting.remove(&next) {
                out.write_chunk(c)?;
                next += 1;
                written += 1;
                chunk_done(written);
            }
        } else {
            out.write_chunk(c)?;
            written += 1;
            chunk_done(written);
        }
    }
    out.finish()
}

/// Writes each chunk's pieces in order from the chunk's buffer and gives
/// the buffer back to the pool. A chunk that is one data piece goes
/// through `behind` (completes in the background) when the cache mode
/// allows: the chunk lends it its buffer. Otherwise each piece is written
/// synchronously, data from the buffer narrowed to the piece; with
/// `behind`, after the writes in flight are done (a write that shares a
/// cluster with an allocation still in flight would wait for it to be
/// published, which only this thread does; chunks never share clusters).
struct ChunkWriter<'a> {
    job: &'a Job<'a>,
    behind: Option<WriteBehind>,
    window: &'a Window,
    lost: LostReport,
}

impl ChunkWriter<'_> {
    fn write_chunk(&mut self, c: ChunkOut) -> Result<(), CliError> {
        for lost in c.lost {
            self.lost.add(lost);
        }
        let lone_data = matches!(c.pieces[..], [Piece::Data { .. }]);
        if !lone_data && !c.pieces.is_empty() {
            self.finish_behind()?;
        }
        let mut buf = c.buf;
        for piece in c.pieces {
            match piece {
                Piece::Data { offset, range } => {
                    buf = self.write_data(offset, range, buf, lone_data)?;
                }
                Piece::Packed { offset, bytes } => {
                    let r = self.job.output.write_packed(offset, &bytes);
                    r.map_err(|source| self.error(offset, source))?;
                }
                Piece::Zeroes { offset, len } => {
                    let r = self.job.output.write_zeroes(offset, len, true);
                    r.map_err(|source| self.error(offset, source))?;
                }
            }
        }
        if let Some(buf) = buf {
            self.window.give(buf);
        }
        self.give_back_written();
        Ok(())
    }

    /// Writes `range` of the chunk's buffer at `offset`; the buffer comes
    /// back unless the write-behind queue took it (`only`: the chunk is
    /// this one data piece, and there is a queue).
    fn write_data(
        &mut self,
        offset: u64,
        range: std::ops::Range<usize>,
        buf: Option<AlignedBuf>,
        only: bool,
    ) -> Result<Option<AlignedBuf>, CliError> {
        let Some(mut buf) = buf else {
            return Err(self.error(offset, BlockError::LostCompletion));
        };
        let len = range.len() as u64;
        if !buf.set_window(range) {
            let size = buf.capacity() as u64;
            return Err(self.error(offset, BlockError::OutOfRange { offset, len, size }));
        }
        match &mut self.behind {
            Some(behind) if only => {
                behind
                    .submit(offset, buf)
                    .map_err(|(at, source)| self.error(at, source))?;
                Ok(None)
            }
            _ => {
                let r = self.job.output.write_from(offset, buf);
                let mut buf = r.map_err(|source| self.error(offset, source))?;
                buf.full_window();
                Ok(Some(buf))
            }
        }
    }

    /// The pool's buffers the write-behind queue has finished with.
    fn give_back_written(&mut self) {
        if let Some(behind) = &mut self.behind {
            for buf in behind.returned() {
                self.window.give(buf);
            }
        }
    }

    /// Waits for the write-behind queue's writes in flight.
    fn finish_behind(&mut self) -> Result<(), CliError> {
        if let Some(b) = &mut self.behind {
            b.finish().map_err(|(at, source)| self.error(at, source))?;
        }
        self.give_back_written();
        Ok(())
    }

    /// Waits for the writes still in flight; reports the last lost range.
    fn finish(&mut self) -> Result<(), CliError> {
        self.lost.flush();
        self.finish_behind()
    }

    fn error(&self, offset: u64, source: BlockError) -> CliError {
        CliError::WriteOutput {
            path: self.job.output_path.into(),
            offset,
            source,
        }
    }
}

/// The source's lost bytes, reported in disk order on stderr, one line
/// per run of neighbouring ranges (with the first range's reason).
#[derive(Default)]
struct LostReport {
    pending: Option<(u64, u64, String)>,
}

impl LostReport {
    fn add(&mut self, lost: Lost) {
        let end = lost.offset + lost.len;
        match &mut self.pending {
            Some((_, to, _)) if *to == lost.offset => *to = end,
            _ => {
                self.flush();
                self.pending = Some((lost.offset, end, lost.error.to_string()));
            }
        }
    }

    fn flush(&mut self) {
        if let Some((from, to, reason)) = self.pending.take() {
            eprintln!(
                "ch-img: warning: bytes {from}..{to} of the source cannot be read ({reason}); they are converted as zeroes"
            );
        }
    }
}
