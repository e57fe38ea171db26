//! What a convert worker does with one chunk of the source: reads it
//! into an aligned buffer of the copy's pool ([`read_chunk`]) and turns
//! it into the writes the writer does ([`pieces_of`]): runs of non-zero
//! `-S` blocks, or with `-c` whole clusters, compressed where that shrinks
//! them (all-zero clusters stay unallocated; clusters compression does
//! not shrink are written as they are, neighbours joined into one piece).
//!
//! A chunk's buffer enters [`read_chunk`] and leaves in a [`ReadChunk`]
//! with the ranges that hold data and the ranges lost to damage
//! ([`crate::convert_source::Extent::Lost`], read as zeroes). Data pieces
//! name ranges of that buffer, so nothing is copied between the read and
//! the write: the writer writes each range from the buffer itself and
//! gives the buffer back to the pool.

use std::ops::Range;

use block::aligned::AlignedBuf;
use block::formats::{compress_cluster, Compression};
use block::BlockError;

use crate::convert_source::{ConvertSource, Extent};
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
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes `range` of the chunk's buffer, written as they are at
    /// `offset` of the virtual disk.
    Data { offset: u64, range: Range<usize> },
    /// One cluster at `offset`, compressed.
    Packed { offset: u64, bytes: Vec<u8> },
    /// `len` bytes at `offset` made to read as zeroes (only where the
    /// output would not read zeroes by itself, see `chunk_fill`).
    Zeroes { offset: u64, len: u64 },
}

/// Bytes of the source that could not be read (they read as zeroes).
#[derive(Debug)]
pub struct Lost {
    pub offset: u64,
    pub len: u64,
    pub error: BlockError,
}

/// One chunk as read: the buffer (its whole window shown), the ranges of
/// it that hold data (chunk-relative, in order, neighbours joined) and the
/// bytes lost to damage. Bytes outside `data` are not read: they hold
/// whatever the buffer held before.
pub struct ReadChunk {
    pub buf: AlignedBuf,
    pub data: Vec<Range<usize>>,
    pub lost: Vec<Lost>,
}

impl ReadChunk {
    /// Zeroes every byte of `0..len` outside the data ranges (the
    /// compressed modes compress whole clusters).
    pub fn zero_outside_data(&mut self, len: usize) {
        let bytes = self.buf.as_mut_slice();
        let mut at = 0;
        for r in &self.data {
            bytes[at..r.start].fill(0);
            at = r.end;
        }
        if at < len {
            bytes[at..len].fill(0);
        }
    }
}

/// Joins `range` to the last of `ranges` when it continues it.
pub fn push_range(ranges: &mut Vec<Range<usize>>, range: Range<usize>) {
    match ranges.last_mut() {
        Some(last) if last.end == range.start => last.end = range.end,
        _ => ranges.push(range),
    }
}

/// Reads the data of `start..start+len` of `source` into `buf` (at least
/// `len` bytes): extents that read as zeroes are not read, lost ones are
/// noted (see [`ReadChunk`]).
pub fn read_chunk(
    source: &ConvertSource,
    start: u64,
    len: u64,
    buf: AlignedBuf,
) -> Result<ReadChunk, CliError> {
    let end = start + len;
    let mut pos = start;
    let mut data = Vec::new();
    let mut lost = Vec::new();
    while pos < end {
        let extent = source.extent(pos, end)?;
        let n = extent.length();
        let at = (pos - start) as usize;
        match extent {
            Extent::Status(s) if !s.zero => push_range(&mut data, at..at + n as usize),
            Extent::Status(_) => {}
            Extent::Lost { len, error } => lost.push(Lost {
                offset: pos,
                len,
                error,
            }),
        }
        pos += n;
    }
    let mut buf = buf;
    for r in &data {
        buf = source.read_into(start + r.start as u64, buf, r.clone())?;
    }
    Ok(ReadChunk { buf, data, lost })
}

/// The writes for one chunk read at disk offset `start`, `len` bytes
/// long (see the module docs).
pub fn pieces_of(
    mode: Mode,
    start: u64,
    len: usize,
    chunk: &mut ReadChunk,
) -> Result<Vec<Piece>, CliError> {
    let mut pieces = Vec::new();
    if chunk.data.is_empty() {
        return Ok(pieces);
    }
    match mode {
        Mode::Sparse { block } => {
            let bytes = chunk.buf.as_slice();
            let mut runs = Vec::new();
            for r in &chunk.data {
                let at = start + r.start as u64;
                for (from, to) in nonzero_runs(at, &bytes[r.clone()], block) {
                    push_range(&mut runs, r.start + from..r.start + to);
                }
            }
            pieces.extend(runs.into_iter().map(|range| Piece::Data {
                offset: start + range.start as u64,
                range,
            }));
        }
        Mode::Compressed {
            cluster_size,
            algorithm,
        } => {
            let cs = cluster_size as usize;
            // The last cluster is zero-padded, as qemu-img does.
            let padded = len.div_ceil(cs) * cs;
            chunk.zero_outside_data(padded);
            let bytes = chunk.buf.as_slice();
            // Clusters compression does not shrink, not yet in `pieces`.
            let mut raw: Option<Range<usize>> = None;
            for from in (0..len).step_by(cs) {
                let cluster = &bytes[from..from + cs];
                if is_zero(cluster) {
                    push_raw(&mut pieces, start, raw.take());
                    continue;
                }
                let offset = start + from as u64;
                let packed = compress_cluster(algorithm, cluster)
                    .map_err(|source| CliError::Write { offset, source })?;
                match packed {
                    Some(bytes) => {
                        push_raw(&mut pieces, start, raw.take());
                        pieces.push(Piece::Packed { offset, bytes });
                    }
                    None => match &mut raw {
                        Some(r) => r.end = from + cs,
                        None => raw = Some(from..from + cs),
                    },
                }
            }
            push_raw(&mut pieces, start, raw);
        }
    }
    Ok(pieces)
}

/// Adds the buffer's `range` as a data piece.
fn push_raw(pieces: &mut Vec<Piece>, start: u64, range: Option<Range<usize>>) {
    if let Some(range) = range {
        pieces.push(Piece::Data {
            offset: start + range.start as u64,
            range,
        });
    }
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
                Piece::Data { offset, range } => ('d', *offset, range.len()),
                Piece::Packed { offset, bytes } => ('p', *offset, bytes.len().min(1)),
                Piece::Zeroes { offset, len } => ('z', *offset, *len as usize),
            })
            .collect()
    }

    /// A chunk whose `data` was read whole into a buffer of `capacity`
    /// bytes that held 0xee before.
    fn read_whole(data: &[u8], capacity: usize) -> ReadChunk {
        let mut buf = AlignedBuf::new(capacity, 4096).unwrap();
        buf.as_mut_slice().fill(0xee);
        buf.as_mut_slice()[..data.len()].copy_from_slice(data);
        ReadChunk {
            buf,
            data: std::iter::once(0..data.len()).collect(),
            lost: Vec::new(),
        }
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
        let mut chunk = read_whole(&data, 16 * cs);
        let pieces = pieces_of(mode, 1 << 20, data.len(), &mut chunk).unwrap();
        let at = |k: usize| (1 << 20) + (k * cs) as u64;
        assert_eq!(
            describe(&pieces),
            vec![('d', at(0), 2 * cs), ('p', at(3), 1), ('d', at(4), 2 * cs)]
        );
        let bytes = chunk.buf.as_slice();
        assert_eq!(&bytes[..2 * cs], &data[..2 * cs]);
        assert_eq!(&bytes[4 * cs..6 * cs - 1], &data[4 * cs..]);
        assert!(bytes[6 * cs - 1] == 0, "the last cluster is zero-padded");
    }

    #[test]
    fn a_chunk_written_as_it_is_is_one_piece_of_its_buffer() {
        let data = noise(4 * 4096, 3);
        let compressed = Mode::Compressed {
            cluster_size: 4096,
            algorithm: Compression::Deflate,
        };
        for mode in [compressed, Mode::Sparse { block: 4096 }] {
            let mut chunk = read_whole(&data, data.len());
            let pieces = pieces_of(mode, 8192, data.len(), &mut chunk).unwrap();
            assert_eq!(describe(&pieces), vec![('d', 8192, data.len())], "{mode:?}");
            assert_eq!(chunk.buf.as_slice(), &data[..]);
        }
    }

    #[test]
    fn sparse_runs_come_only_from_the_data_ranges() {
        // Two data extents (the second starts with a zero block) around a
        // hole whose stale bytes must not be written.
        let mut buf = AlignedBuf::new(6 * 4096, 4096).unwrap();
        buf.as_mut_slice().fill(0xee);
        buf.as_mut_slice()[4 * 4096..5 * 4096].fill(0);
        let mut chunk = ReadChunk {
            buf,
            data: vec![0..2 * 4096, 4 * 4096..6 * 4096],
            lost: Vec::new(),
        };
        let pieces = pieces_of(Mode::Sparse { block: 4096 }, 0, 6 * 4096, &mut chunk).unwrap();
        assert_eq!(
            pieces,
            vec![
                Piece::Data {
                    offset: 0,
                    range: 0..2 * 4096
                },
                Piece::Data {
                    offset: 5 * 4096,
                    range: 5 * 4096..6 * 4096
                },
            ]
        );
    }

    #[test]
    fn compressed_chunks_zero_what_was_not_read() {
        let mut buf = AlignedBuf::new(4 * 4096, 4096).unwrap();
        buf.as_mut_slice().fill(0xee);
        let mut chunk = ReadChunk {
            buf,
            data: std::iter::once(4096..2 * 4096).collect(),
            lost: Vec::new(),
        };
        let mode = Mode::Compressed {
            cluster_size: 4096,
            algorithm: Compression::Zstd,
        };
        let pieces = pieces_of(mode, 0, 3 * 4096 + 5, &mut chunk).unwrap();
        // The stale bytes of the unread clusters became zeroes: only the
        // read cluster is written (0xee compresses).
        assert_eq!(describe(&pieces), vec![('p', 4096, 1)]);
        assert!(chunk.buf.as_slice()[2 * 4096..4 * 4096]
            .iter()
            .all(|&b| b == 0));
    }
}
