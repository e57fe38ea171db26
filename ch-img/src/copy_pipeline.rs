//! convert's copy: `-m` workers read (and with `-c` compress) chunks of
//! the source concurrently; the calling thread writes them to the output.
//!
//! The virtual disk is cut into chunks, numbered in disk order. A worker
//! takes the next number, reads the chunk through its own handle on the
//! source (ranges `block_status` reports as zero are not read), and sends
//! the pieces to write: runs of non-zero `-S` blocks, or with `-c` whole
//! clusters, compressed where that shrinks them (all-zero clusters stay
//! unallocated). The writer writes chunks in disk order (so a `-c` output
//! is laid out exactly as a serial run's) or, with `-W`, as they arrive,
//! joining data pieces that continue each other into larger writes.
//! Workers stay at most `window` chunks ahead of the writer, which bounds
//! memory. The first error stops everything and is returned.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};

use block::formats::{compress_cluster, Compression};

use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::progress::Progress;
use crate::write_behind::WriteBehind;

/// Bytes per chunk without `-c` (with `-c`: 16 clusters).
const CHUNK: u64 = 2 << 20;

/// How the data is written.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Runs of non-zero blocks of this size (`-S`; 0: every data byte).
    Sparse { block: u64 },
    /// Whole clusters, compressed with the output's algorithm.
    Compressed {
        cluster_size: u64,
        algorithm: Compression,
    },
}

/// What a convert copies and how.
pub struct Job<'a> {
    /// Opens one handle on the source (each worker has its own).
    pub open_source: &'a (dyn Fn() -> Result<ImageIo, CliError> + Sync),
    pub output: &'a ImageIo,
    /// Names the output in write errors.
    pub output_path: &'a str,
    pub size: u64,
    pub mode: Mode,
    pub workers: usize,
    pub in_order: bool,
}

/// One write the writer does.
enum Piece {
    Data { offset: u64, bytes: Vec<u8> },
    Packed { offset: u64, bytes: Vec<u8> },
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
    let (tx, rx) = mpsc::channel::<ChunkResult>();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let tx = tx.clone();
            let reader = Reader {
                open_source: job.open_source,
                size: job.size,
                mode: job.mode,
                chunk,
                chunks,
                window: &window,
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
    open_source: &'a (dyn Fn() -> Result<ImageIo, CliError> + Sync),
    size: u64,
    mode: Mode,
    chunk: u64,
    chunks: u64,
    window: &'a Window,
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
            let pieces = read_chunk(&source, start, len, &mut buf).and_then(|any| {
                if !any {
                    return Ok(Vec::new());
                }
                pieces_of(self.mode, start, &buf[..len as usize])
            });
            let failed = pieces.is_err();
            if tx.send((i, pieces)).is_err() || failed {
                return;
            }
        }
    }
}

/// Reads `start..start+len` into `buf` (zero ranges are not read);
/// whether any of it was read.
fn read_chunk(source: &ImageIo, start: u64, len: u64, buf: &mut Vec<u8>) -> Result<bool, CliError> {
    buf.clear();
    buf.resize(len as usize, 0);
    let end = start + len;
    let mut pos = start;
    let mut any = false;
    while pos < end {
        let status = source.extent_at(pos, end)?;
        if !status.zero {
            let at = (pos - start) as usize;
            source
                .read_at(pos, &mut buf[at..at + status.len as usize])
                .map_err(|source| CliError::Read {
                    offset: pos,
                    source,
                })?;
            any = true;
        }
        pos += status.len;
    }
    Ok(any)
}

/// The writes for one chunk's data (see the module docs).
fn pieces_of(mode: Mode, start: u64, data: &[u8]) -> Result<Vec<Piece>, CliError> {
    let mut pieces = Vec::new();
    match mode {
        Mode::Sparse { block } => {
            for (from, to) in nonzero_runs(start, data, block) {
                pieces.push(Piece::Data {
                    offset: start + from as u64,
                    bytes: data[from..to].to_vec(),
                });
            }
        }
        Mode::Compressed {
            cluster_size,
            algorithm,
        } => {
            for (k, part) in data.chunks(cluster_size as usize).enumerate() {
                if part.iter().all(|&b| b == 0) {
                    continue;
                }
                let offset = start + k as u64 * cluster_size;
                // The last cluster is zero-padded, as qemu-img does.
                let mut cluster = part.to_vec();
                cluster.resize(cluster_size as usize, 0);
                let packed = compress_cluster(algorithm, &cluster)
                    .map_err(|source| CliError::Write { offset, source })?;
                pieces.push(match packed {
                    Some(bytes) => Piece::Packed { offset, bytes },
                    None => Piece::Data {
                        offset,
                        bytes: cluster,
                    },
                });
            }
        }
    }
    Ok(pieces)
}

/// Byte ranges of `data` (which starts at disk offset `start`) made of
/// blocks that are not all zero; blocks are aligned to the disk, not to
/// `data`. `block` 0 takes all of `data`.
fn nonzero_runs(start: u64, data: &[u8], block: u64) -> Vec<(usize, usize)> {
    if block == 0 {
        return vec![(0, data.len())];
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0usize;
    while i < data.len() {
        let end = ((((start + i as u64) / block + 1) * block - start) as usize).min(data.len());
        if data[i..end].iter().any(|&b| b != 0) {
            match runs.last_mut() {
                Some(last) if last.1 == i => last.1 = end,
                _ => runs.push((i, end)),
            }
        }
        i = end;
    }
    runs
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
    };
    let mut next = 0u64;
    let mut written = 0u64;
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
                window.advance();
                progress.update((written * chunk).min(job.size));
            }
        } else {
            out.write_pieces(pieces)?;
            written += 1;
            window.advance();
            progress.update((written * chunk).min(job.size));
        }
    }
    out.write_held()?;
    out.finish()
}

/// Most bytes of data pieces joined into one write.
const JOINED_MAX: usize = 8 << 20;

/// Writes pieces in the order given, holding back a data piece so that
/// the data pieces that continue it (the next chunk's first run, the
/// next incompressible cluster) join it, up to [`JOINED_MAX`] bytes: one
/// allocation and one large write instead of one synchronous write per
/// chunk or cluster, which is what an O_DIRECT target (`-t none`) waits
/// for. Anything else written first writes the held piece, so the
/// allocator sees the same sequence as without joining. Data writes go
/// through `behind` (complete in the background) when the cache mode
/// allows.
struct JoiningWriter<'a> {
    job: &'a Job<'a>,
    held: Option<(u64, Vec<u8>)>,
    behind: Option<WriteBehind>,
}

impl JoiningWriter<'_> {
    fn write_pieces(&mut self, pieces: Vec<Piece>) -> Result<(), CliError> {
        for piece in pieces {
            match piece {
                Piece::Data { offset, bytes } => {
                    if let Some((at, held)) = &mut self.held {
                        if *at + held.len() as u64 == offset
                            && held.len() + bytes.len() <= JOINED_MAX
                        {
                            held.extend_from_slice(&bytes);
                            continue;
                        }
                    }
                    self.write_held()?;
                    self.held = Some((offset, bytes));
                }
                Piece::Packed { offset, bytes } => {
                    self.write_held()?;
                    let r = self.job.output.write_packed(offset, &bytes);
                    r.map_err(|source| self.error(offset, source))?;
                }
            }
        }
        Ok(())
    }

    /// Writes the held data piece, if any.
    fn write_held(&mut self) -> Result<(), CliError> {
        let Some((offset, bytes)) = self.held.take() else {
            return Ok(());
        };
        match &mut self.behind {
            Some(b) => b
                .write(offset, &bytes)
                .map_err(|(at, source)| self.error(at, source)),
            None => {
                let r = self.job.output.write_at(offset, &bytes);
                r.map_err(|source| self.error(offset, source))
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_follow_disk_aligned_blocks() {
        let mut data = vec![0u8; 16];
        data[1] = 1; // disk offset 5: block 4..8
        data[13] = 1; // disk offset 17: block 16..20
        assert_eq!(nonzero_runs(4, &data, 4), vec![(0, 4), (12, 16)]);
        assert_eq!(nonzero_runs(4, &data, 0), vec![(0, 16)]);
        data[5] = 1; // block 8..12 joins the first run
        assert_eq!(nonzero_runs(4, &data, 4), vec![(0, 8), (12, 16)]);
    }
}
