//! Inflating compressed clusters for the executor, and a small per-queue
//! cache of recently inflated clusters.
//!
//! The compressed bytes read from the image enter [`inflate`] (the
//! decompression itself is the qcow2 format's
//! `formats::qcow2::compression::compressed::inflate_cluster`); a cluster of exactly
//! `cluster_size` bytes leaves, or an error saying why the stream is bad.
//! The cache (one per disk, shared by its queues) lets sequential small
//! reads inflate each cluster once.

use std::sync::Arc;

use crate::formats::{CompressedExtent, Compression, FileId};

/// Largest cluster qcow2 allows (2 MiB).
pub const MAX_CLUSTER_SIZE: u32 = 2 << 20;

/// Inflates `input` into one cluster of `cluster_size` bytes.
pub fn inflate(algorithm: Compression, input: &[u8], cluster_size: u32) -> Result<Vec<u8>, String> {
    if cluster_size == 0 || cluster_size > MAX_CLUSTER_SIZE {
        return Err(format!("cluster size {cluster_size} out of range"));
    }
    crate::formats::qcow2::compression::compressed::inflate_cluster(
        algorithm,
        input,
        cluster_size as usize,
    )
}

/// Identifies a compressed cluster's bytes in the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CacheKey {
    file: FileId,
    host_offset: u64,
    compressed_len: u64,
}

impl CacheKey {
    fn of(ext: &CompressedExtent) -> Self {
        CacheKey {
            file: ext.file,
            host_offset: ext.host_offset,
            compressed_len: ext.compressed_len,
        }
    }
}

/// Recently inflated clusters, least recently used first; bounded by
/// bytes. qcow2 never rewrites a compressed cluster in place (writes move
/// the guest cluster elsewhere), so a cached cluster stays valid for as
/// long as a plan still points at the same host bytes.
#[derive(Default)]
pub struct InflateCache {
    entries: Vec<(CacheKey, Arc<Vec<u8>>)>,
    bytes: usize,
}

/// At most this many bytes of inflated clusters per disk (shared by its
/// queues).
const CACHE_BYTES: usize = 8 << 20;

/// And at most this many clusters (lookups are a linear search).
const CACHE_ENTRIES: usize = 256;

impl InflateCache {
    pub fn get(&mut self, ext: &CompressedExtent) -> Option<Arc<Vec<u8>>> {
        let key = CacheKey::of(ext);
        let i = self.entries.iter().position(|(k, _)| *k == key)?;
        let e = self.entries.remove(i);
        let data = e.1.clone();
        self.entries.push(e);
        Some(data)
    }

    pub fn insert(&mut self, ext: &CompressedExtent, data: Arc<Vec<u8>>) {
        let key = CacheKey::of(ext);
        if self.entries.iter().any(|(k, _)| *k == key) {
            return;
        }
        self.bytes += data.len();
        self.entries.push((key, data));
        while (self.bytes > CACHE_BYTES || self.entries.len() > CACHE_ENTRIES)
            && self.entries.len() > 1
        {
            let (_, old) = self.entries.remove(0);
            self.bytes -= old.len();
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn deflate_with_padding_inflates_and_truncated_fails() {
        let data: Vec<u8> = (0..65536u32)
            .map(|i| (i % 251) as u8 ^ (i / 4096) as u8)
            .collect();
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&data).unwrap();
        let mut comp = e.finish().unwrap();
        comp.extend_from_slice(&[0u8; 300]);
        assert_eq!(inflate(Compression::Deflate, &comp, 65536).unwrap(), data);
        assert!(inflate(Compression::Deflate, &comp[..comp.len() / 4], 65536).is_err());
        assert!(inflate(Compression::Zstd, b"garbage garbage", 65536).is_err());
        assert!(inflate(Compression::Deflate, &comp, MAX_CLUSTER_SIZE * 2).is_err());
    }

    #[test]
    fn cache_evicts_by_bytes() {
        let mut c = InflateCache::default();
        let ext = |off| CompressedExtent {
            file: FileId(0),
            host_offset: off,
            compressed_len: 100,
            algorithm: Compression::Deflate,
            cluster_size: 1 << 20,
            offset_in_cluster: 0,
        };
        for i in 0..10 {
            c.insert(&ext(i), Arc::new(vec![0; 1 << 20]));
        }
        assert!(c.get(&ext(0)).is_none());
        assert!(c.get(&ext(9)).is_some());
        assert!(c.bytes <= CACHE_BYTES);
        for i in 0..1000 {
            c.insert(&ext(100 + i), Arc::new(vec![0; 16]));
        }
        assert!(c.entries.len() <= CACHE_ENTRIES);
        assert!(c.get(&ext(1099)).is_some());
    }
}
