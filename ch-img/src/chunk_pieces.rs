//! What a convert worker does with one chunk of the source: reads it
//! into a buffer it owns ([`read_chunk`]) and turns it into the writes the
//! writer does ([`pieces_of`]): runs of non-zero `-S` blocks, or with `-c`
//! whole clusters, compressed where that shrinks them (all-zero clusters
//! stay unallocated; clusters compression does not shrink are written as
//! they are, neighbours joined into one piece).
//!
//! A chunk's buffer enters [`read_chunk`] (any earlier contents) and
//! leaves as the chunk's bytes; [`pieces_of`] takes it and either hands it
//! back (the pieces are copies or compressed bytes) or makes it the
//! chunk's only data piece when every byte of it is written as it is
//! (an incompressible chunk, a chunk without zero blocks): no copy. The
//! pieces leave to the writer, which may give written buffers back
//! ([`SpareBuffers`]) for the next reads.

use std::sync::Mutex;

use block::formats::{compress_cluster, Compression};

use crate::convert_source::ConvertSource;
use crate::error::CliError;

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

/// One write the writer does.
pub enum Piece {
    /// Bytes written as they are at `offset` of the virtual disk.
    Data { offset: u64, bytes: Vec<u8> },
    /// One cluster at `offset`, compressed.
    Packed { offset: u64, bytes: Vec<u8> },
    /// `len` bytes at `offset` made to read as zeroes (only where the
    /// output would not read zeroes by itself, see `chunk_fill`).
    Zeroes { offset: u64, len: u64 },
}

/// Buffers the writer has written, for workers to read the next chunks
/// into instead of allocating (and page-faulting in) new ones.
pub struct SpareBuffers {
    buffers: Mutex<Vec<Vec<u8>>>,
    /// Buffers kept at most.
    keep: usize,
    /// Smallest and largest capacity worth keeping.
    min_capacity: usize,
    max_capacity: usize,
}

impl SpareBuffers {
    /// A pool for reads of `chunk` bytes, keeping at most `keep` buffers.
    pub fn new(chunk: usize, keep: usize) -> Self {
        SpareBuffers {
            buffers: Mutex::new(Vec::new()),
            keep,
            min_capacity: chunk,
            max_capacity: 2 * chunk,
        }
    }

    /// A buffer with room for a chunk, or an empty one.
    pub fn take(&self) -> Vec<u8> {
        let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        buffers.pop().unwrap_or_default()
    }

    /// Keeps `buf` for a later read if it is the right size and there is room.
    pub fn give(&self, buf: Vec<u8>) {
        if buf.capacity() < self.min_capacity || buf.capacity() > self.max_capacity {
            return;
        }
        let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        if buffers.len() < self.keep {
            buffers.push(buf);
        }
    }
}

/// Reads `start..start+len` of `source` into `buf` (zero ranges are not
/// read, but zeroed); returns the buffer and whether any of it was read
/// (if not, it holds stale bytes: not to be used).
pub fn read_chunk(
    source: &ConvertSource,
    start: u64,
    len: u64,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, bool), CliError> {
    // Earlier contents are overwritten below: no need to zero them first.
    buf.resize(len as usize, 0);
    let end = start + len;
    let mut pos = start;
    let mut any = false;
    // Zeroed only when something was read: an all-zero chunk is skipped.
    let mut zero_ranges = Vec::new();
    while pos < end {
        let status = source.extent_at(pos, end)?;
        let at = (pos - start) as usize;
        let range = at..at + status.len as usize;
        let read_error = |source| CliError::Read {
            offset: pos,
            source,
        };
        if status.zero {
            zero_ranges.push(range);
        } else if status.len == len {
            // The whole chunk: the request reads into the buffer itself.
            buf = source.read_owned(pos, buf).map_err(read_error)?;
            any = true;
        } else {
            source.read_at(pos, &mut buf[range]).map_err(read_error)?;
            any = true;
        }
        pos += status.len;
    }
    if any {
        for range in zero_ranges {
            buf[range].fill(0);
        }
    }
    Ok((buf, any))
}

/// The writes for one chunk's bytes `data`, which start at disk offset
/// `start` (see the module docs), and `data` back unless it became the
/// only piece.
pub fn pieces_of(
    mode: Mode,
    start: u64,
    data: Vec<u8>,
) -> Result<(Vec<Piece>, Option<Vec<u8>>), CliError> {
    let mut pieces = Vec::new();
    match mode {
        Mode::Sparse { block } => {
            let runs = nonzero_runs(start, &data, block);
            if let [(0, to)] = runs[..] {
                if to == data.len() {
                    pieces.push(Piece::Data {
                        offset: start,
                        bytes: data,
                    });
                    return Ok((pieces, None));
                }
            }
            for (from, to) in runs {
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
            let cs = cluster_size as usize;
            // Clusters compression does not shrink, not yet in `pieces`:
            // data[from..to] (`to` may pass the end: the last cluster is
            // zero-padded, as qemu-img does).
            let mut raw: Option<(usize, usize)> = None;
            for (k, part) in data.chunks(cs).enumerate() {
                let from = k * cs;
                if is_zero(part) {
                    push_raw(&mut pieces, start, &data, raw.take());
                    continue;
                }
                let offset = start + from as u64;
                let packed = if part.len() == cs {
                    compress_cluster(algorithm, part)
                } else {
                    let mut cluster = part.to_vec();
                    cluster.resize(cs, 0);
                    compress_cluster(algorithm, &cluster)
                };
                match packed.map_err(|source| CliError::Write { offset, source })? {
                    Some(bytes) => {
                        push_raw(&mut pieces, start, &data, raw.take());
                        pieces.push(Piece::Packed { offset, bytes });
                    }
                    None => match &mut raw {
                        Some((_, to)) => *to = from + cs,
                        None => raw = Some((from, from + cs)),
                    },
                }
            }
            if pieces.is_empty() && raw == Some((0, data.len())) {
                pieces.push(Piece::Data {
                    offset: start,
                    bytes: data,
                });
                return Ok((pieces, None));
            }
            push_raw(&mut pieces, start, &data, raw);
        }
    }
    Ok((pieces, Some(data)))
}

/// Adds `data[from..to]` (zero-padded past the end) as a data piece.
fn push_raw(pieces: &mut Vec<Piece>, start: u64, data: &[u8], raw: Option<(usize, usize)>) {
    let Some((from, to)) = raw else {
        return;
    };
    let mut bytes = data[from..to.min(data.len())].to_vec();
    bytes.resize(to - from, 0);
    pieces.push(Piece::Data {
        offset: start + from as u64,
        bytes,
    });
}

/// Byte ranges of `data` (which starts at disk offset `start`) made of
/// blocks that are not all zero; blocks are aligned to the disk, not to
/// `data`. `block` 0 takes all of `data`.
pub fn nonzero_runs(start: u64, data: &[u8], block: u64) -> Vec<(usize, usize)> {
    if block == 0 {
        return vec![(0, data.len())];
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0usize;
    while i < data.len() {
        let end = ((((start + i as u64) / block + 1) * block - start) as usize).min(data.len());
        if !is_zero(&data[i..end]) {
            match runs.last_mut() {
                Some(last) if last.1 == i => last.1 = end,
                _ => runs.push((i, end)),
            }
        }
        i = end;
    }
    runs
}

/// Whether every byte of `data` is zero. Looks at 256 bytes at a time
/// without stopping inside them (the compiler turns that into a few wide
/// ORs), a byte-by-byte loop was a tenth of convert -c's CPU time.
pub fn is_zero(data: &[u8]) -> bool {
    let mut blocks = data.chunks_exact(256);
    for block in &mut blocks {
        if block.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
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

    #[test]
    fn zero_check_sees_every_byte() {
        for len in [0usize, 1, 255, 256, 257, 4096, 65536 + 17] {
            let mut data = vec![0u8; len];
            assert!(is_zero(&data), "len {len}");
            for at in [0, len / 2, len.saturating_sub(1)] {
                if at < len {
                    data[at] = 0x80;
                    assert!(!is_zero(&data), "len {len} byte {at}");
                    data[at] = 0;
                }
            }
        }
    }

    /// Bytes that neither algorithm shrinks (xorshift).
    fn noise(len: usize, mut x: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn describe(pieces: &[Piece]) -> Vec<(char, u64, usize)> {
        pieces
            .iter()
            .map(|p| match p {
                Piece::Data { offset, bytes } => ('d', *offset, bytes.len()),
                Piece::Packed { offset, bytes } => ('p', *offset, bytes.len().min(1)),
                Piece::Zeroes { offset, len } => ('z', *offset, *len as usize),
            })
            .collect()
    }

    #[test]
    fn compressed_chunk_joins_incompressible_neighbours() {
        let cs = 4096usize;
        let mode = Mode::Compressed {
            cluster_size: cs as u64,
            algorithm: Compression::Zstd,
        };
        // noise, noise, zero, text, noise, then a noisy tail one byte short
        // of a cluster.
        let mut data = noise(2 * cs, 1);
        data.extend(vec![0u8; cs]);
        data.extend(b"compressible ".repeat(cs / 13 + 1)[..cs].to_vec());
        data.extend(noise(2 * cs - 1, 2));
        let (pieces, back) = pieces_of(mode, 1 << 20, data.clone()).unwrap();
        assert_eq!(back.as_deref(), Some(&data[..]));
        let at = |k: usize| (1 << 20) + (k * cs) as u64;
        assert_eq!(
            describe(&pieces),
            vec![('d', at(0), 2 * cs), ('p', at(3), 1), ('d', at(4), 2 * cs)]
        );
        let Piece::Data { bytes, .. } = &pieces[2] else {
            panic!("not data")
        };
        assert_eq!(&bytes[..2 * cs - 1], &data[4 * cs..]);
        assert!(bytes[2 * cs - 1] == 0, "the last cluster is zero-padded");
    }

    #[test]
    fn a_chunk_written_as_it_is_becomes_its_own_piece() {
        let data = noise(4 * 4096, 3);
        let compressed = Mode::Compressed {
            cluster_size: 4096,
            algorithm: Compression::Deflate,
        };
        for mode in [compressed, Mode::Sparse { block: 4096 }] {
            let (pieces, back) = pieces_of(mode, 8192, data.clone()).unwrap();
            assert!(back.is_none(), "{mode:?}");
            assert_eq!(describe(&pieces), vec![('d', 8192, data.len())]);
            let Piece::Data { bytes, .. } = &pieces[0] else {
                panic!("not data")
            };
            assert_eq!(bytes, &data);
        }
    }
}
