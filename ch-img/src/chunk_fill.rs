//! convert's chunks when the output does not read zeroes by itself: an
//! existing target (`-n`), or a target with a backing file (`-B`, `-o
//! backing_file=`), as qemu-img 7.2 copies them.
//!
//! The source's extents enter [`read_filled`] and leave as spans of the
//! chunk, each [`Class`]ified:
//! - with a target backing file, what the source's top image does not
//!   allocate itself (its backing chain shows there) is left to the
//!   target's backing file, and so is anything reading as zeroes past
//!   that backing file's end ([`Class::Keep`]): only what the top image
//!   holds is written, as qemu-img assumes the two backing files match;
//! - what reads as zeroes is written as zeroes ([`Class::Zero`]), since
//!   the target would otherwise show its old data or its backing file;
//! - the rest is data ([`Class::Data`]).
//!
//! - bytes lost to damage ([`crate::convert_source::Extent::Lost`]) read
//!   as zeroes, so they are written as zeroes too.
//!
//! [`filled_pieces`] turns the spans and the chunk's bytes into the
//! writes: data runs (`-S` blocks that are all zero become zeroes too),
//! or with `-c` whole clusters, compressed, and zero clusters as
//! write-zeroes; a `-c` cluster only partly left to the backing file is
//! written whole (its bytes were read through the source's chain). Data
//! pieces name ranges of the chunk's buffer, as in
//! [`crate::chunk_pieces`].

use block::aligned::AlignedBuf;
use block::formats::compress_cluster;

use crate::chunk_pieces::{is_zero, push_range, Lost, Mode, Piece, ReadChunk};
use crate::convert_source::{ConvertSource, Extent};
use crate::error::CliError;

/// What the output needs besides the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    /// Zeroes must be written where the source reads zeroes.
    pub zeroes: bool,
    /// The output's backing file and its size: what the source's top
    /// image does not allocate is left to it.
    pub backing: Option<u64>,
}

impl Fill {
    /// A new output without a backing file: it reads zeroes where nothing
    /// is written.
    pub const PLAIN: Fill = Fill {
        zeroes: false,
        backing: None,
    };
}

/// What one span of a chunk needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Data,
    Zero,
    Keep,
}

/// A chunk read and its classified spans.
pub type Classified = (ReadChunk, Vec<Span>);

/// A range of the chunk's bytes and its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub from: usize,
    pub to: usize,
    pub class: Class,
}

/// Reads `start..start+len` of `source` into `buf` and classifies it.
/// Nothing is read when the whole chunk is left to the target's backing
/// file. With `-c` the spans left to the backing file are read too, and
/// zero spans zero-filled, so that every cluster can be written whole.
pub fn read_filled(
    source: &ConvertSource,
    start: u64,
    len: u64,
    buf: AlignedBuf,
    fill: Fill,
    mode: Mode,
) -> Result<Classified, CliError> {
    let end = start + len;
    let mut spans: Vec<Span> = Vec::new();
    let mut lost = Vec::new();
    let mut pos = start;
    while pos < end {
        let extent = source.extent(pos, end)?;
        let mut stop = pos + extent.length();
        let class = match extent {
            Extent::Lost { len, error } => {
                lost.push(Lost {
                    offset: pos,
                    len,
                    error,
                });
                Class::Zero
            }
            Extent::Status(status) => match fill.backing {
                Some(_) if status.depth > 0 => Class::Keep,
                Some(b) if status.zero && pos >= b => Class::Keep,
                Some(b) if status.zero && stop > b => {
                    // Zeroes up to the backing file's end, left to it after.
                    stop = b;
                    Class::Zero
                }
                _ if status.zero => Class::Zero,
                _ => Class::Data,
            },
        };
        let (from, to) = ((pos - start) as usize, (stop - start) as usize);
        match spans.last_mut() {
            Some(last) if last.class == class && last.to == from => last.to = to,
            _ => spans.push(Span { from, to, class }),
        }
        pos = stop;
    }
    let compressed = matches!(mode, Mode::Compressed { .. });
    let left_to_backing = spans.iter().all(|s| s.class == Class::Keep);
    let mut data = Vec::new();
    let mut buf = buf;
    for span in spans.iter().filter(|_| !left_to_backing) {
        match span.class {
            Class::Data => push_range(&mut data, span.from..span.to),
            Class::Keep if compressed => push_range(&mut data, span.from..span.to),
            Class::Zero if compressed => buf.as_mut_slice()[span.from..span.to].fill(0),
            Class::Keep | Class::Zero => {}
        }
    }
    for r in &data {
        buf = source.read_into(start + r.start as u64, buf, r.clone())?;
    }
    Ok((ReadChunk { buf, data, lost }, spans))
}

/// The writes for one classified chunk of `len` bytes at disk offset
/// `start` (see the module docs).
pub fn filled_pieces(
    mode: Mode,
    start: u64,
    len: usize,
    chunk: &mut ReadChunk,
    spans: &[Span],
) -> Result<Vec<Piece>, CliError> {
    let mut out = Pieces::default();
    match mode {
        Mode::Sparse { block } => {
            let data = chunk.buf.as_slice();
            for span in spans {
                match span.class {
                    Class::Keep => {}
                    Class::Zero => out.zeroes(start, span.from, span.to),
                    Class::Data if block == 0 => out.data(start, span.from, span.to),
                    Class::Data => {
                        let mut at = span.from;
                        while at < span.to {
                            let disk = start + at as u64;
                            let next = ((disk / block + 1) * block - start) as usize;
                            let to = next.min(span.to);
                            if is_zero(&data[at..to]) {
                                out.zeroes(start, at, to);
                            } else {
                                out.data(start, at, to);
                            }
                            at = to;
                        }
                    }
                }
            }
        }
        Mode::Compressed {
            cluster_size,
            algorithm,
        } => {
            let cs = cluster_size as usize;
            // The last cluster is zero-padded, as qemu-img does.
            chunk.buf.as_mut_slice()[len..len.div_ceil(cs) * cs].fill(0);
            let data = chunk.buf.as_slice();
            for from in (0..len).step_by(cs) {
                let to = (from + cs).min(len);
                let kept = spans
                    .iter()
                    .filter(|s| s.from < to && s.to > from)
                    .all(|s| s.class == Class::Keep);
                if kept {
                    continue;
                }
                let cluster = &data[from..from + cs];
                if is_zero(cluster) {
                    out.zeroes(start, from, to);
                    continue;
                }
                let offset = start + from as u64;
                let packed = compress_cluster(algorithm, cluster)
                    .map_err(|source| CliError::Write { offset, source })?;
                match packed {
                    Some(bytes) => out.pieces.push(Piece::Packed { offset, bytes }),
                    None => out.data(start, from, from + cs),
                }
            }
        }
    }
    Ok(out.pieces)
}

/// Pieces being gathered, neighbours of one kind joined.
#[derive(Default)]
struct Pieces {
    pieces: Vec<Piece>,
}

impl Pieces {
    fn zeroes(&mut self, start: u64, from: usize, to: usize) {
        let offset = start + from as u64;
        let len = (to - from) as u64;
        match self.pieces.last_mut() {
            Some(Piece::Zeroes { offset: o, len: l }) if *o + *l == offset => *l += len,
            _ => self.pieces.push(Piece::Zeroes { offset, len }),
        }
    }

    /// Adds the buffer's `from..to`, which lies at `start + from` of the
    /// disk.
    fn data(&mut self, start: u64, from: usize, to: usize) {
        match self.pieces.last_mut() {
            Some(Piece::Data { range, .. }) if range.end == from => range.end = to,
            _ => self.pieces.push(Piece::Data {
                offset: start + from as u64,
                range: from..to,
            }),
        }
    }
}
