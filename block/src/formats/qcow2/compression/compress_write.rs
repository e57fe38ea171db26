//! Writing compressed clusters (`ch-img convert -c`), as qemu-img does.
//!
//! A whole guest cluster enters; it is compressed with the image's
//! compression type (raw deflate with a 4 KiB window, which is what qemu
//! inflates with, or a zstd frame). When that does not make it smaller
//! than a cluster the caller writes it as a normal cluster instead.
//! Otherwise:
//! 1. the cluster's L2 table is made writable (the target cluster must be
//!    unallocated: compressed data never replaces a mapped cluster);
//! 2. bytes are taken from the end of the previous compressed cluster when
//!    they fit there (or in freshly allocated clusters right behind it),
//!    else from new clusters; every host cluster the data touches gets one
//!    more reference (`MetaState::alloc_compressed_bytes`);
//! 3. the data goes to the compressed-cluster write cache
//!    (`compressed_cache`), which writes whole host clusters and then
//!    publishes the L2 entry (compressed descriptor) like any allocating
//!    write's: it reaches the disk at the next flush, after a barrier has
//!    made data and refcounts durable. Without the cache (capacity 0)
//!    the bytes are written at once, through the metadata-I/O seam, and
//!    the entry published the same way.
//!
//! Compression ([`compress_cluster`]) is separate from steps 1-3
//! (`CompressedWriter`, `write_compressed_packed`), so a tool can
//! compress on every core and write in order. Only for tools writing an image on their own (convert): there
//! is no in-flight tracking against queues writing the same clusters.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use flate2::{Compress, FlushCompress, Status};

use crate::error::BlockError;
use crate::formats::qcow2::chain::Chain;
use crate::formats::qcow2::metadata::meta_io::MetaKind;
use crate::formats::qcow2::on_disk::l2_entry::{compressed_entry, L2Entry};
use crate::formats::qcow2::state::State;
use crate::formats::Compression;

/// qemu inflates compressed clusters with a 2^12-byte deflate window.
const DEFLATE_WINDOW_BITS: u8 = 12;

/// zstd's default level (3), which qemu compresses with too (it sets no
/// level on its context).
const ZSTD_LEVEL: i32 = 0;

// One compressor per thread, reset for every cluster (setting one up
// allocates its window and hash tables: a new zstd context per cluster was
// a tenth of convert -c's CPU time). The zstd context is `None` until a
// thread first needs one, or when creating it failed.
thread_local! {
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new_with_window_bits(
        flate2::Compression::default(),
        false,
        DEFLATE_WINDOW_BITS,
    ));
    static ZSTD: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    // Where a cluster is compressed: the result is copied out at its own
    // size, and an incompressible cluster costs no allocation.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `data` (one cluster) compressed with `algorithm`, or `None` when the
/// result would not be smaller than `data` minus one byte (qemu's limit).
/// Pure: callers may compress on many threads and write in order with
/// [`crate::formats::CompressedWrites::write_compressed_packed`].
pub fn compress_cluster(
    algorithm: Compression,
    data: &[u8],
) -> Result<Option<Vec<u8>>, BlockError> {
    let limit = data.len() - 1;
    SCRATCH.with(|cell| {
        let mut out = cell.borrow_mut();
        out.clear();
        match algorithm {
            Compression::Deflate => {
                // Room for deflate's worst case (stored blocks): zlib-rs
                // panics when an incompressible cluster meets a smaller
                // buffer.
                out.reserve(data.len() + data.len() / 8 + 64);
                let status = DEFLATE.with(|cell| {
                    let mut c = cell.borrow_mut();
                    c.reset();
                    c.compress_vec(data, &mut out, FlushCompress::Finish)
                });
                match status {
                    Ok(Status::StreamEnd) => {}
                    // The output buffer filled up first: not compressible.
                    Ok(_) => return Ok(None),
                    Err(e) => return Err(compress_error(e.to_string())),
                }
            }
            Compression::Zstd => {
                out.reserve(zstd::zstd_safe::compress_bound(data.len()));
                ZSTD.with(|cell| {
                    let mut slot = cell.borrow_mut();
                    let compressor = match slot.as_mut() {
                        Some(c) => c,
                        None => slot.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL)?),
                    };
                    // Every call is a frame of its own: the same bytes as
                    // a fresh context's (`zstd::bulk::compress`).
                    compressor.compress_to_buffer(data, &mut *out)
                })
                .map_err(|e| compress_error(e.to_string()))?;
            }
        }
        // Only what compressed leaves the scratch buffer, at its size.
        Ok((out.len() <= limit).then(|| out.to_vec()))
    })
}

fn compress_error(reason: String) -> BlockError {
    BlockError::Write {
        offset: 0,
        source: std::io::Error::other(format!("compressing a cluster: {reason}")),
    }
}

/// Whether a compressed write of `len` bytes at `guest` is possible at
/// all: a whole cluster inside the disk of a writable image whose data
/// lives in the image file.
pub(crate) fn check_compressed_write(
    chain: &Chain,
    readonly: bool,
    size: u64,
    guest: u64,
    len: u64,
) -> Result<(), BlockError> {
    if readonly {
        return Err(BlockError::ReadOnly);
    }
    let cs = chain.header.cluster_size();
    if !guest.is_multiple_of(cs) || len != cs || guest >= size {
        return Err(BlockError::OutOfRange {
            offset: guest,
            len,
            size,
        });
    }
    if chain.header.has_data_file() {
        return Err(BlockError::Unsupported {
            path: chain.path.clone(),
            feature: "compressed clusters in an image with an external data file".into(),
        });
    }
    Ok(())
}

/// Steps 1-3 of the module docs, over the image's locked state; `cached`
/// is the image's flag that its compressed-write cache may hold data.
pub(crate) struct CompressedWriter<'a> {
    pub chain: &'a Chain,
    pub st: &'a mut State,
    pub cached: &'a AtomicBool,
}

impl CompressedWriter<'_> {
    /// Writes `packed`, guest cluster `guest` compressed with the image's
    /// compression type ([`compress_cluster`]), after
    /// [`check_compressed_write`].
    pub fn write(&mut self, guest: u64, packed: &[u8]) -> Result<(), BlockError> {
        let cs = self.chain.header.cluster_size();
        if packed.is_empty() || packed.len() as u64 >= cs {
            return Err(BlockError::OutOfRange {
                offset: guest,
                len: packed.len() as u64,
                size: cs,
            });
        }
        let State {
            meta, compressed, ..
        } = &mut *self.st;
        let mapped = !matches!(
            meta.l2_entry(guest)?.0,
            L2Entry::Unallocated | L2Entry::Zero { host: None, .. }
        );
        if mapped || compressed.is_pending(guest) {
            return Err(BlockError::Unsupported {
                path: self.chain.path.clone(),
                feature: format!("a compressed write over the allocated cluster at {guest:#x}"),
            });
        }
        // The L2 table is allocated before the data, as qemu-img lays it out.
        meta.writable_l2(guest)?;
        let host = meta.alloc_compressed_bytes(packed.len() as u64)?;
        let raw = compressed_entry(host, packed.len() as u64, meta.geometry().cluster_bits);
        if compressed.capacity() == 0 {
            // No cache: one write per compressed cluster, through the
            // metadata-I/O seam (checked against the metadata there).
            meta.write(MetaKind::GuestData, host, packed)?;
            meta.publish_l2_entry(guest, raw, 0)?;
            if meta.should_flush() {
                meta.flush_dirty()?;
            }
            return Ok(());
        }
        self.cached.store(true, Ordering::Release);
        compressed.insert(meta.io(), cs, guest, raw, host, packed)?;
        if compressed.is_full(meta.compressed_tail(), cs) {
            compressed.write_out(meta, &self.chain.files.local()[0], false)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incompressible_small_clusters_are_refused_not_a_panic() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for algorithm in [Compression::Deflate, Compression::Zstd] {
            assert_eq!(compress_cluster(algorithm, &data).unwrap(), None);
            let text = b"compressible ".repeat(400);
            let packed = compress_cluster(algorithm, &text[..4096]).unwrap().unwrap();
            assert!(packed.len() < 4096);
        }
    }

    #[test]
    fn the_reused_zstd_context_writes_what_a_fresh_one_writes() {
        let text: Vec<u8> = (0..4000u32)
            .flat_map(|i| format!("{i:08} the quick brown fox\n").into_bytes())
            .collect();
        for cluster in [&text[..65536], &text[1000..66536], &vec![7u8; 65536][..]] {
            let fresh = zstd::bulk::compress(cluster, ZSTD_LEVEL).unwrap();
            for _ in 0..3 {
                let packed = compress_cluster(Compression::Zstd, cluster).unwrap();
                assert_eq!(packed.as_deref(), Some(&fresh[..]));
            }
        }
    }
}
