//! [`CreateOptions`]: qemu-img create's `-f` and `-o` options, as every
//! format's `create` takes them (`super::driver::FormatDriver::create`),
//! and the refusal that names one of them ([`CreateOptions::invalid`]).

use std::path::PathBuf;

use crate::error::BlockError;
use crate::new_file::FileIdentity;
use crate::options::ImageType;
use crate::prealloc::Preallocation;

/// qemu-img create's `-f` and `-o` options that we support.
#[derive(Clone, Debug, Default)]
pub struct CreateOptions {
    pub path: PathBuf,
    /// The new image's format (a registered one; `Auto` is refused).
    pub format: ImageType,
    /// Virtual size in bytes (may be taken from the backing file when 0
    /// and a backing file is given, as qemu-img does).
    pub size: u64,
    /// Default 64 KiB.
    pub cluster_size: Option<u64>,
    /// Stored as given; resolved against the new image's folder on open.
    pub backing_file: Option<String>,
    pub backing_fmt: Option<ImageType>,
    /// "0.10" (v2) or "1.1" (v3, default); "v2"/"v3" accepted too.
    pub compat: Option<String>,
    /// Default 16.
    pub refcount_bits: Option<u32>,
    pub lazy_refcounts: bool,
    pub extended_l2: bool,
    /// Compress clusters with zstd instead of zlib (`compression_type`;
    /// needs compat=1.1).
    pub zstd: bool,
    /// qemu-img's `preallocation=` (raw: off, falloc, full).
    pub preallocation: Preallocation,
    /// Files the new image must not be: the files the command reads
    /// (`convert`'s source chains, the backing file). Checked after the
    /// file is locked, before it is truncated.
    pub sources: Vec<FileIdentity>,
    /// qemu-img's `create -u`: the backing file is recorded without being
    /// opened (it may be missing); the size must then be given.
    pub unsafe_backing: bool,
}

impl CreateOptions {
    /// The refusal of option `option` of this image, saying why.
    pub fn invalid(&self, option: &str, why: impl std::fmt::Display) -> BlockError {
        BlockError::InvalidImage {
            path: self.path.clone(),
            reason: format!("option {option}: {why}"),
        }
    }

    /// The preallocation in qemu-img's "Formatting" line: named when it
    /// is not off (qemu-img names it when it was given).
    pub fn shown_preallocation(&self) -> String {
        match self.preallocation {
            Preallocation::Off => String::new(),
            p => format!(" preallocation={p}"),
        }
    }
}
