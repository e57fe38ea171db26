//! qcow2 feature bits (header fields incompatible_features,
//! compatible_features, autoclear_features) and compression type codes.
//!
//! Pure constants and names; the header parser and the open path decide
//! what to do with them.

/// The image was not closed cleanly; refcounts may be stale (lazy refcounts).
pub(crate) const INCOMPAT_DIRTY: u64 = 1 << 0;
/// qemu found corruption; the image may only be opened read-only.
pub(crate) const INCOMPAT_CORRUPT: u64 = 1 << 1;
/// Guest data lives in an external data file.
pub(crate) const INCOMPAT_DATA_FILE: u64 = 1 << 2;
/// The compression_type header field is not deflate.
pub(crate) const INCOMPAT_COMPRESSION: u64 = 1 << 3;
/// L2 entries are 128 bits with a subcluster bitmap.
pub(crate) const INCOMPAT_EXTL2: u64 = 1 << 4;
pub(crate) const INCOMPAT_KNOWN: u64 =
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2;

/// Refcounts may be updated lazily (the dirty bit then says so).
pub(crate) const COMPAT_LAZY_REFCOUNTS: u64 = 1 << 0;

/// The persistent bitmaps extension is consistent (a program that does not
/// update bitmaps clears it on a read-write open).
pub(crate) const AUTOCLEAR_BITMAPS: u64 = 1 << 0;
/// The external data file is a raw image of the guest disk.
pub(crate) const AUTOCLEAR_DATA_FILE_RAW: u64 = 1 << 1;
/// Autoclear bits we keep correct when writing.
pub(crate) const AUTOCLEAR_KNOWN: u64 = AUTOCLEAR_DATA_FILE_RAW;

pub(crate) const COMPRESSION_DEFLATE: u8 = 0;
pub(crate) const COMPRESSION_ZSTD: u8 = 1;
