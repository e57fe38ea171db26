//! convert's source: one image, or several read one after another as one
//! disk (`ch-img convert A B C OUT`), each possibly an internal snapshot
//! (`-l`).
//!
//! The sources' paths and options enter [`ConvertSource::open`] (each
//! worker opens its own); reads, block status and read-ahead hints at
//! offsets of the joined disk leave, each served by the image that holds
//! the offset (an extent never crosses from one image into the next).
//! [`ConvertSource::identities`] lists every file the sources read
//! (their backing chains and data files too), which the output must not
//! be.

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

    /// The block status of the extent at `pos`, cut at `end` and at the
    /// end of the image holding `pos`.
    pub fn extent_at(&self, pos: u64, end: u64) -> Result<BlockStatus, CliError> {
        let (io, start, stop) = self.part(pos);
        io.extent_at(pos - start, end.min(stop) - start)
    }

    /// Fills `buf` with the joined disk's bytes at `offset` (within one
    /// extent, so within one image).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let (io, start, _) = self.part(offset);
        io.read_at(offset - start, buf)
    }

    /// [`ImageIo::read_owned`] at an offset of the joined disk.
    pub fn read_owned(&self, offset: u64, buf: Vec<u8>) -> Result<Vec<u8>, BlockError> {
        let (io, start, _) = self.part(offset);
        io.read_owned(offset - start, buf)
    }

    /// [`ImageIo::will_need`] at an offset of the joined disk.
    pub fn will_need(&self, offset: u64, len: u64) {
        let (io, start, stop) = self.part(offset);
        io.will_need(offset - start, len.min(stop - offset));
    }
}
