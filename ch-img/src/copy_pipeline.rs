//! convert's copy: `-m` workers read (and with `-c` compress) chunks of
//! the source concurrently; the calling thread writes them to the output.
//!
//! The virtual disk is cut into chunks, numbered in disk order. A worker
//! takes the next number, reads the chunk through its own handle on the
//! source (ranges `block_status` reports as zero are not read), and sends
//! the pieces to write ([`crate::chunk_pieces`]). The writer writes chunks
//! in disk order (so a `-c` output is laid out exactly as a serial run's)
//! or, with `-W`, as they arrive, joining data pieces that continue each
//! other into larger writes, and gives the buffers it wrote back to the
//! workers for their next reads. Workers stay at most `window` chunks
//! ahead of the writer, which bounds memory. The first error stops
//! everything and is returned.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};

use crate::chunk_fill::{filled_pieces, read_filled, Fill};
use crate::chunk_pieces::{pieces_of, read_chunk, Piece, SpareBuffers};
use crate::convert_source::ConvertSource;
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::progress::Progress;
use crate::write_behind::WriteBehind;

pub use crate::chunk_pieces::Mode;

/// Bytes per chunk without `-c` (with `-c`: 16 clusters).
const CHUNK: u64 = 2 << 20;

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
}

/// The hand-out of chunk numbers, bounded by what was written.
struct Window {
    state: Mutex<(u64, u64)>, // (next to hand out, chunks written)
    moved: Condvar,
    stop: AtomicBool,
    ahead: u64,
}

impl Window {
    /// The next chunk to work on, waiting while workers are too far ahead;
    /// `None` when there is none left or the copy stopped.
    fn take(&self, chunks: u64) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.stop.load(Ordering::Relaxed) || st.0 >= chunks {
                return None;
            }
            if st.0 < st.1 + self.ahead {
                st.0 += 1;
                return Some(st.0 - 1);
            }
            st = self.moved.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn advance(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).1 += 1;
        self.moved.notify_all();
    }

    fn halt(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let _guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
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
    let window = Window {
        state: Mutex::new((0, 0)),
        moved: Condvar::new(),
        stop: AtomicBool::new(false),
        ahead: 2 * workers as u64,
    };
    // Enough for every chunk in flight; the rest are dropped.
    let spare = SpareBuffers::new(chunk as usize, 2 * workers + 2);
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
                window: &window,
                spare: &spare,
                readahead: workers as u64,
            };
            scope.spawn(move || reader.work(&tx));
        }
        drop(tx);
        let result = write_all(job, chunk, chunks, &rx, &window, &spare, progress);
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
    window: &'a Window,
    spare: &'a SpareBuffers,
    /// Chunks ahead of its own that a worker asks the kernel to read.
    readahead: u64,
}

/// A chunk's number and its pieces, from a worker to the writer.
type ChunkResult = (u64, Result<Vec<Piece>, CliError>);

impl Reader<'_> {
    fn work(self, tx: &mpsc::Sender<ChunkResult>) {
        let source = match (self.open_source)() {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send((0, Err(e)));
                return;
            }
        };
        let mut buf = Vec::new();
        while let Some(i) = self.window.take(self.chunks) {
            let start = i * self.chunk;
            let len = self.chunk.min(self.size - start);
            // The chunk the workers take after the ones being read now.
            let ahead = start.saturating_add(self.readahead.saturating_mul(self.chunk));
            if ahead < self.size {
                source.will_need(ahead, self.chunk.min(self.size - ahead));
            }
            if buf.capacity() < len as usize {
                buf = self.spare.take();
            }
            let pieces = self.pieces(&source, start, len, &mut buf);
            let failed = pieces.is_err();
            if tx.send((i, pieces)).is_err() || failed {
                return;
            }
        }
    }

    /// Reads one chunk into `buf` and makes its pieces; `buf` ends up
    /// holding a buffer for the next chunk.
    fn pieces(
        &self,
        source: &ConvertSource,
        start: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> Result<Vec<Piece>, CliError> {
        let taken = std::mem::take(buf);
        let (pieces, back) = if self.fill == Fill::PLAIN {
            match read_chunk(source, start, len, taken)? {
                (data, false) => (Vec::new(), Some(data)),
                (data, true) => pieces_of(self.mode, start, data)?,
            }
        } else {
            match read_filled(source, start, len, taken, self.fill)? {
                None => (Vec::new(), None),
                Some((data, spans)) => filled_pieces(self.mode, start, data, &spans)?,
            }
        };
        *buf = back.unwrap_or_default();
        Ok(pieces)
    }
}

/// The writer: chunk results in disk order (or as they come with `-W`).
fn write_all(
    job: &Job,
    chunk: u64,
    chunks: u64,
    rx: &mpsc::Receiver<ChunkResult>,
    window: &Window,
    spare: &SpareBuffers,
    progress: &mut Progress,
) -> Result<(), CliError> {
    let mut waiting: BTreeMap<u64, Vec<Piece>> = BTreeMap::new();
    let behind = WriteBehind::new(job.output).map_err(|source| CliError::WriteOutput {
        path: job.output_path.into(),
        offset: 0,
        source,
    })?;
    let mut out = JoiningWriter {
        job,
        held: None,
        behind,
        spare,
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
        let Ok((i, result)) = rx.recv() else {
            return Err(CliError::Usage("convert workers stopped early".into()));
        };
        let pieces = result?;
        if job.in_order {
            waiting.insert(i, pieces);
            while let Some(pieces) = waiting.remove(&next) {
                out.write_pieces(pieces)?;
                next += 1;
                written += 1;
                chunk_done(written);
            }
        } else {
            out.write_pieces(pieces)?;
            written += 1;
            chunk_done(written);
        }
    }
    out.write_held()?;
    out.finish()
}

/// Chunks written between two [`ImageIo::start_writeback`] calls.
const WRITEBACK_EVERY: u64 = 16;

/// Most bytes of data pieces joined into one write.
const JOINED_MAX: usize = 8 << 20;

/// Writes pieces in the order given, holding back a data piece so that
/// the data pieces that continue it (the next chunk's first run, the
/// next incompressible clusters) join it, up to [`JOINED_MAX`] bytes: one
/// allocation and one large write instead of one synchronous write per
/// chunk or cluster, which is what an O_DIRECT target (`-t none`) waits
/// for. With `-c` a piece that does not fit whole is cut at
/// [`JOINED_MAX`] (pieces are whole clusters), so the writes are the same
/// however the workers grouped the clusters into pieces. Anything else
/// written first writes the held piece, so the allocator sees the same
/// sequence as without joining. Data writes go through `behind`
/// (complete in the background) when the cache mode allows; written
/// buffers go back to `spare`.
struct JoiningWriter<'a> {
    job: &'a Job<'a>,
    held: Option<(u64, Vec<u8>)>,
    behind: Option<WriteBehind>,
    spare: &'a SpareBuffers,
}

impl JoiningWriter<'_> {
    fn write_pieces(&mut self, pieces: Vec<Piece>) -> Result<(), CliError> {
        for piece in pieces {
            match piece {
                Piece::Data { offset, bytes } => self.write_data(offset, bytes)?,
                Piece::Packed { offset, bytes } => {
                    self.write_held()?;
                    let r = self.job.output.write_packed(offset, &bytes);
                    r.map_err(|source| self.error(offset, source))?;
                }
                Piece::Zeroes { offset, len } => {
                    self.write_held()?;
                    let r = self.job.output.write_zeroes(offset, len, true);
                    r.map_err(|source| self.error(offset, source))?;
                }
            }
        }
        Ok(())
    }

    /// Joins `bytes` to the held piece when it continues it, else writes
    /// the held piece and holds this one; with `-c`, cut at
    /// [`JOINED_MAX`].
    fn write_data(&mut self, offset: u64, bytes: Vec<u8>) -> Result<(), CliError> {
        let joins = matches!(&self.held, Some((at, held)) if *at + held.len() as u64 == offset);
        let cut = matches!(self.job.mode, Mode::Compressed { .. });
        let fits = |held: &Vec<u8>| held.len() + bytes.len() <= JOINED_MAX;
        let (mut at, mut held) = match self.held.take() {
            Some((at, held)) if joins && (cut || fits(&held)) => (at, held),
            other => {
                self.held = other;
                self.write_held()?;
                if !cut || bytes.len() <= JOINED_MAX {
                    self.held = Some((offset, bytes));
                    return Ok(());
                }
                (offset, Vec::new())
            }
        };
        let mut rest = &bytes[..];
        loop {
            let take = rest.len().min(JOINED_MAX.saturating_sub(held.len()));
            held.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if rest.is_empty() {
                break;
            }
            let next = at + held.len() as u64;
            self.held = Some((at, held));
            self.write_held()?;
            (at, held) = (next, Vec::new());
        }
        self.held = Some((at, held));
        self.spare.give(bytes);
        Ok(())
    }

    /// Writes the held data piece, if any.
    fn write_held(&mut self) -> Result<(), CliError> {
        let Some((offset, bytes)) = self.held.take() else {
            return Ok(());
        };
        let back = match &mut self.behind {
            Some(b) => b
                .write(offset, &bytes)
                .map(|()| Some(bytes))
                .map_err(|(at, source)| self.error(at, source))?,
            None => {
                let r = self.job.output.write_owned(offset, bytes);
                r.map_err(|source| self.error(offset, source))?
            }
        };
        if let Some(buf) = back {
            self.spare.give(buf);
        }
        Ok(())
    }

    /// Waits for the writes still in flight.
    fn finish(&mut self) -> Result<(), CliError> {
        match &mut self.behind {
            Some(b) => b.finish().map_err(|(at, source)| self.error(at, source)),
            None => Ok(()),
        }
    }

    fn error(&self, offset: u64, source: block::BlockError) -> CliError {
        CliError::WriteOutput {
            path: self.job.output_path.into(),
            offset,
            source,
        }
    }
}
