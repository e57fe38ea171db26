//! Where convert's chunks begin and end. Chunk `k` is `k * C..(k + 1) * C`
//! of the disk (C: the chunk size), except that without `-c` a boundary
//! moves forward past a short data extent that would straddle it, so the
//! extent is read and written as one piece, not two: on an O_DIRECT
//! target or source every piece is a device request of its own, and a
//! sparse source's extents (tens of KiB to a few MiB) straddle a 2 MiB
//! grid often (a 1 GiB source a quarter full: 480 writes where qemu-img,
//! which walks extents rather than a grid, makes 385).
//!
//! Every worker computes the boundaries of its own chunk from the
//! source's extents alone ([`chunk_range`]), so the two workers on either
//! side of a boundary agree on it without talking. Boundary `k * C` moves
//! when, walking the previous chunk's extents from `(k - 1) * C`, the last
//! one starts after `(k - 1) * C` (not a piece of a longer extent seen
//! from the middle), holds data, and runs past `k * C`: it moves to that
//! extent's end, at most [`max_shift`] further. A chunk is thus at least
//! C - [`max_shift`] and at most C + [`max_shift`] bytes long.

use std::ops::Range;

use crate::convert_source::{ConvertSource, Extent};
use crate::error::CliError;

/// How far past its place on the grid a boundary may move: half a chunk
/// (the pool's buffers hold C + this many bytes, their pages mapped only
/// where a chunk reaches).
pub const fn max_shift(chunk: u64) -> u64 {
    chunk / 2
}

/// The disk range of chunk `k` of a disk of `size` bytes, chunks of
/// `chunk` bytes; with `movable` false the plain grid (`-c` writes whole
/// clusters, which a moved boundary would cut).
pub fn chunk_range(
    source: &ConvertSource,
    k: u64,
    chunk: u64,
    size: u64,
    movable: bool,
) -> Result<Range<u64>, CliError> {
    let start = boundary(source, k, chunk, size, movable)?;
    let end = boundary(source, k + 1, chunk, size, movable)?;
    Ok(start..end)
}

/// Where chunk `k` begins (see the module docs).
fn boundary(
    source: &ConvertSource,
    k: u64,
    chunk: u64,
    size: u64,
    movable: bool,
) -> Result<u64, CliError> {
    let grid = k.saturating_mul(chunk).min(size);
    if !movable || k == 0 || grid == size {
        return Ok(grid);
    }
    let from = grid - chunk;
    let mut pos = from;
    let mut last = from;
    while pos < grid {
        last = pos;
        pos += source.extent(pos, grid)?.length();
    }
    if last == from {
        return Ok(grid);
    }
    let reach = (grid + max_shift(chunk)).min(size);
    match source.extent(last, reach)? {
        Extent::Status(s) if !s.zero => Ok(last + s.len),
        _ => Ok(grid),
    }
}
