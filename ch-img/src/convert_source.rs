//! convert's source: one image, or several read one after another as one
//! disk (`ch-img convert A B C OUT`), each possibly an internal snapshot
//! (`-l`).
//!
//! The sources' paths and options enter [`ConvertSource::open`] (each
//! worker opens its own); reads, extents and read-ahead hints at offsets
//! of the joined disk leave, each served by the image that holds the
//! offset (an extent never crosses from one image into the next; a read
//! is split where one image ends). [`ConvertSource::identities`] lists
//! every file the sources read (their backing chains and data files too),
//! which the output must not be.
//!
//! Salvage: where an image's metadata puts guest bytes past the end of
//! its file (a truncated image, an L1 or L2 entry gone wrong), qemu-img
//! 7.2 reads zeroes and converts the rest. [`ConvertSource::extent`] does
//! the same: the block layer refuses such a range with
//! [`BlockError::BeyondEndOfFile`], which names the guest bytes it costs,
//! and the range comes back as [`Extent::Lost`] (read as zeroes, reported
//! by the writer) while the bytes around it are read as usual. Any other
//! damage still stops the copy, as it stops qemu-img's.

use std::ops::Range;

use block::aligned::AlignedBuf;
use block::create::FileIdentity;
use block::formats::{BlockStatus, SnapshotRef};
use block::options::CacheMode;
use block::{BlockError, DiskOptions, ImageType};

use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::open_error;

/// How the sources are opened.
#[derive(Clone, Debug)]
pub struct SourceSpec {
    pub paths: Vec<String>,
    pub format: ImageType,
    pub cache: CacheMode,
    /// `-U`: the sources may be written by others meanwhile.
    pub force_share: bool,
    /// `-l`: read this internal snapshot (one source only).
    pub snapshot: Option<SnapshotRef>,
}

/// The opened sources, each with the offset of the joined disk where it
/// starts.
pub struct ConvertSource {
    parts: Vec<(u64, ImageIo)>,
    size: u64,
}

impl ConvertSource {
    /// Opens every source read-only (locked as a reader, or force-shared).
    pub fn open(spec: &SourceSpec) -> Result<ConvertSource, CliError> {
        let mut parts = Vec::with_capacity(spec.paths.len());
        let mut size = 0u64;
        for path in &spec.paths {
            let mut opts = DiskOptions::new(path);
            opts.readonly = true;
            opts.force_share = spec.force_share;
            opts.image_type = spec.format;
            opts.direct = spec.cache.direct();
            opts.snapshot = spec.snapshot.clone();
            let image = ImageIo::open(&opts, spec.cache).map_err(|source| match source {
                BlockError::NoSuchSnapshot { .. } => {
                    CliError::Usage("Failed to load snapshot: Can't find snapshot".into())
                }
                // An image without snapshots (raw, an NBD export).
                BlockError::CannotDo { reason, .. } => {
                    CliError::Usage(format!("Failed to load snapshot: {reason}"))
                }
                source => open_error(path, spec.cache, source),
            })?;
            let start = size;
            size = size.checked_add(image.size()).ok_or_else(|| {
                CliError::Usage("the sources together are larger than 16 EiB".into())
            })?;
            parts.push((start, image));
        }
        Ok(ConvertSource { parts, size })
    }

    /// The joined disk's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Every file the sources read, by device and inode.
    pub fn identities(&self) -> Vec<FileIdentity> {
        self.parts
            .iter()
            .flat_map(|(_, io)| io.file_identities())
            .collect()
    }

    /// The image holding `pos`, where it starts and where it ends.
    fn part(&self, pos: u64) -> (&ImageIo, u64, u64) {
        let i = self
            .parts
            .partition_point(|(start, _)| *start <= pos)
            .saturating_sub(1);
        let end = self.parts.get(i + 1).map_or(self.size, |(s, _)| *s);
        let (start, io) = &self.parts[i];
        (io, *start, end)
    }

    /// The extent at `pos`, cut at `end` and at the end of the image
    /// holding `pos`: its block status, or the bytes lost to damage (see
    /// the module docs).
    pub fn extent(&self, pos: u64, end: u64) -> Result<Extent, CliError> {
        let (io, start, stop) = self.part(pos);
        let mut limit = end.min(stop);
        loop {
            let error = match io.extent_at(pos - start, limit - start) {
                Ok(status) => return Ok(Extent::Status(status)),
                Err(CliError::BlockStatus {
                    source: error @ BlockError::BeyondEndOfFile { .. },
                    ..
                }) => error,
                Err(other) => return Err(other),
            };
            let BlockError::BeyondEndOfFile { guest, len, .. } = error else {
                unreachable!("matched above");
            };
            let lost_from = guest.saturating_add(start);
            let lost_to = lost_from.saturating_add(len);
            if lost_from <= pos && pos < lost_to {
                let len = lost_to.min(limit) - pos;
                return Ok(Extent::Lost { len, error });
            }
            if pos < lost_from && lost_from < limit {
                // The damage lies further on: ask again for what precedes it.
                limit = lost_from;
                continue;
            }
            return Err(CliError::BlockStatus {
                offset: pos,
                source: error,
            });
        }
    }

    /// Reads the joined disk's bytes at `offset` into `range` of `buf`,
    /// image by image, and returns the buffer (its whole window shown).
    pub fn read_into(
        &self,
        offset: u64,
        mut buf: AlignedBuf,
        range: Range<usize>,
    ) -> Result<AlignedBuf, CliError> {
        let mut at = range.start;
        while at < range.end {
            let pos = offset + (at - range.start) as u64;
            let (io, start, stop) = self.part(pos);
            let n = ((stop - pos) as usize).min(range.end - at);
            let fail = |source| CliError::Read {
                offset: pos,
                source,
            };
            if !buf.set_window(at..at + n) {
                return Err(fail(BlockError::OutOfRange {
                    offset: at as u64,
                    len: n as u64,
                    size: buf.capacity() as u64,
                }));
            }
            buf = io.read_into(pos - start, buf).map_err(fail)?;
            at += n;
        }
        buf.full_window();
        Ok(buf)
    }

    /// [`ImageIo::will_need`] at an offset of the joined disk.
    pub fn will_need(&self, offset: u64, len: u64) {
        let (io, start, stop) = self.part(offset);
        io.will_need(offset - start, len.min(stop - offset));
    }
}

/// An extent of the source (see [`ConvertSource::extent`]).
pub enum Extent {
    /// Readable; its block status (`len` included).
    Status(BlockStatus),
    /// `len` bytes the source's metadata puts past the end of its file:
    /// they read as zeroes, and `error` says why.
    Lost { len: u64, error: BlockError },
}

impl Extent {
    /// The bytes it covers.
    pub fn length(&self) -> u64 {
        match self {
            Extent::Status(s) => s.len,
            Extent::Lost { len, .. } => *len,
        }
    }
}
