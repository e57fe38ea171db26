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
//! [`filled_pieces`] turns the spans and the chunk's bytes into the
//! writes: data runs (`-S` blocks that are all zero become zeroes too),
//! or with `-c` whole clusters, compressed, and zero clusters as
//! write-zeroes; a `-c` cluster only partly left to the backing file is
//! written whole (its bytes were read through the source's chain).

use block::formats::compress_cluster;

use crate::chunk_pieces::{is_zero, Mode, Piece};
use crate::convert_source::ConvertSource;
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

/// A chunk's bytes and its classified spans.
pub type Classified = (Vec<u8>, Vec<Span>);

/// A range of the chunk's bytes and its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub from: usize,
    pub to: usize,
    pub class: Class,
}

/// Reads `start..start+len` of `source` into `buf` and classifies it;
/// `None` when the whole chunk is left to the target's backing file.
/// Every byte is read (zero spans zero-filled), so a `-c` cluster that is
/// partly left to the backing file can be written whole.
pub fn read_filled(
    source: &ConvertSource,
    start: u64,
    len: u64,
    mut buf: Vec<u8>,
    fill: Fill,
) -> Result<Option<Classified>, CliError> {
    let end = start + len;
    let mut spans: Vec<Span> = Vec::new();
    let mut pos = start;
    while pos < end {
        let status = source.extent_at(pos, end)?;
        let mut stop = pos + status.len;
        let class = match fill.backing {
            Some(_) if status.depth > 0 => Class::Keep,
            Some(b) if status.zero && pos >= b => Class::Keep,
            Some(b) if status.zero && stop > b => {
                // Zeroes up to the backing file's end, left to it after.
                stop = b;
                Class::Zero
            }
            _ if status.zero => Class::Zero,
            _ => Class::Data,
        };
        let (from, to) = ((pos - start) as usize, (stop - start) as usize);
        match spans.last_mut() {
            Some(last) if last.class == class && last.to == from => last.to = to,
            _ => spans.push(Span { from, to, class }),
        }
        pos = stop;
    }
    if spans.iter().all(|s| s.class == Class::Keep) {
        return Ok(None);
    }
    buf.resize(len as usize, 0);
    for span in &spans {
        let at = start + span.from as u64;
        let bytes = &mut buf[span.from..span.to];
        if span.class == Class::Zero {
            bytes.fill(0);
        } else {
            source
                .read_at(at, bytes)
                .map_err(|source| CliError::Read { offset: at, source })?;
        }
    }
    Ok(Some((buf, spans)))
}

/// The writes for one classified chunk (see the module docs); `data`
/// comes back for reuse.
pub fn filled_pieces(
    mode: Mode,
    start: u64,
    data: Vec<u8>,
    spans: &[Span],
) -> Result<(Vec<Piece>, Option<Vec<u8>>), CliError> {
    let mut out = Pieces::default();
    match mode {
        Mode::Sparse { block } => {
            for span in spans {
                match span.class {
                    Class::Keep => {}
                    Class::Zero => out.zeroes(start, span.from, span.to),
                    Class::Data if block == 0 => out.data(start, &data, span.from, span.to),
                    Class::Data => {
                        let mut at = span.from;
                        while at < span.to {
                            let disk = start + at as u64;
                            let next = ((disk / block + 1) * block - start) as usize;
                            let to = next.min(span.to);
                            if is_zero(&data[at..to]) {
                                out.zeroes(start, at, to);
                            } else {
                                out.data(start, &data, at, to);
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
            for from in (0..data.len()).step_by(cs) {
                let to = (from + cs).min(data.len());
                let kept = spans
                    .iter()
                    .filter(|s| s.from < to && s.to > from)
                    .all(|s| s.class == Class::Keep);
                if kept {
                    continue;
                }
                let part = &data[from..to];
                if is_zero(part) {
                    out.zeroes(start, from, to);
                    continue;
                }
                let offset = start + from as u64;
                let mut cluster = part.to_vec();
                cluster.resize(cs, 0);
                let packed = compress_cluster(algorithm, &cluster)
                    .map_err(|source| CliError::Write { offset, source })?;
                match packed {
                    Some(bytes) => out.pieces.push(Piece::Packed { offset, bytes }),
                    // The last cluster is zero-padded, as qemu-img does.
                    None => out.data_at(offset, &cluster),
                }
            }
        }
    }
    Ok((out.pieces, Some(data)))
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

    /// Adds `data[from..to]`, which lies at `start + from` of the disk.
    fn data(&mut self, start: u64, data: &[u8], from: usize, to: usize) {
        self.data_at(start + from as u64, &data[from..to]);
    }

    /// Adds `bytes` at disk offset `offset`.
    fn data_at(&mut self, offset: u64, bytes: &[u8]) {
        match self.pieces.last_mut() {
            Some(Piece::Data {
                offset: o,
                bytes: b,
            }) if *o + b.len() as u64 == offset => b.extend_from_slice(bytes),
            _ => self.pieces.push(Piece::Data {
                offset,
                bytes: bytes.to_vec(),
            }),
        }
    }
}
