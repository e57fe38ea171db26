//! Compressed clusters: how many bytes to read for one, and inflating them
//! (raw deflate or zstd, the header's compression_type).
//!
//! The descriptor's sector count enters (untrusted); a read length clamped
//! to the file leaves ([`compressed_read_len`]). Compressed bytes enter
//! [`inflate_cluster`]; exactly one cluster of data leaves, or an error
//! when the stream is corrupt or too short. The engines call
//! `inflate_cluster` for `ReadSource::Compressed` pieces too.

use std::cell::RefCell;

use flate2::{Decompress, FlushDecompress, Status};
use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};

use crate::formats::qcow2::on_disk::l2_entry::CompressedDescriptor;
use crate::formats::Compression;

/// Bytes to read for a compressed cluster: the descriptor's length, never
/// past the end of the file (the last sector may be partial there).
pub(crate) fn compressed_read_len(desc: &CompressedDescriptor, file_size: u64) -> u64 {
    desc.max_len.min(file_size.saturating_sub(desc.host_offset))
}

/// Inflates `input` into one cluster of `cluster_size` bytes. The
/// decoders write straight into the new vector's spare capacity (exactly
/// `cluster_size`, as `Vec::with_capacity` guarantees), so the cluster is
/// not zeroed first: that cost as much as inflating a zstd cluster.
/// Trailing bytes after the stream are ignored; a stream that stops short
/// of the cluster is an error.
pub(crate) fn inflate_cluster(
    algorithm: Compression,
    input: &[u8],
    cluster_size: usize,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(cluster_size);
    let name = match algorithm {
        Compression::Deflate => {
            inflate_deflate(input, &mut out)?;
            "deflate"
        }
        Compression::Zstd => {
            inflate_zstd(input, &mut out)?;
            "zstd"
        }
    };
    if out.len() != cluster_size {
        return Err(format!(
            "{name} stream inflates to {} bytes, expected {cluster_size}",
            out.len()
        ));
    }
    Ok(out)
}

// One decoder per thread, reset for every cluster: creating a zstd
// context per cluster cost more than decompressing it.
thread_local! {
    static DEFLATE: RefCell<Decompress> = RefCell::new(Decompress::new(false));
    static ZSTD: RefCell<Option<Decoder<'static>>> = const { RefCell::new(None) };
}

/// Inflates into `out`'s spare capacity (never past it).
fn inflate_deflate(input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    DEFLATE.with(|cell| {
        let mut d = cell.borrow_mut();
        d.reset(false);
        match d.decompress_vec(input, out, FlushDecompress::Finish) {
            // qemu accepts a stream that filled the buffer without its end marker.
            Ok(Status::StreamEnd) | Ok(Status::Ok) | Ok(Status::BufError) => Ok(()),
            Err(e) => Err(format!("deflate: {e}")),
        }
    })
}

/// Inflates into `out`'s spare capacity (never past it).
fn inflate_zstd(input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    ZSTD.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = match slot.as_mut() {
            Some(d) => {
                d.reinit().map_err(|e| format!("zstd: {e}"))?;
                d
            }
            None => slot.insert(Decoder::new().map_err(|e| format!("zstd: {e}"))?),
        };
        let mut input = InBuffer::around(input);
        // Each round consumes input or produces output, or we stop.
        while out.len() < out.capacity() {
            let (read, written) = (input.pos(), out.len());
            let remaining = d
                .run(&mut input, &mut OutBuffer::around(&mut *out))
                .map_err(|e| format!("zstd: {e}"))?;
            if remaining == 0 || (input.pos() == read && out.len() == written) {
                break;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sample() -> Vec<u8> {
        (0..4096u32).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn deflate_round_trip_with_trailing_garbage() {
        let data = sample();
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&data).unwrap();
        let mut c = e.finish().unwrap();
        c.extend_from_slice(&[0xff; 300]);
        assert_eq!(
            inflate_cluster(Compression::Deflate, &c, 4096).unwrap(),
            data
        );
        // Short of the cluster: an error.
        assert!(inflate_cluster(Compression::Deflate, &c, 8192).is_err());
        assert!(inflate_cluster(Compression::Deflate, &[1, 2, 3], 4096).is_err());
        // Longer than the cluster: its first cluster_size bytes, as qemu.
        assert_eq!(
            inflate_cluster(Compression::Deflate, &c, 1000).unwrap(),
            &data[..1000]
        );
        assert_eq!(
            inflate_cluster(Compression::Deflate, &c, 4096).unwrap(),
            data
        );
    }

    #[test]
    fn zstd_round_trip_with_trailing_garbage() {
        let data = sample();
        let mut c = zstd::bulk::compress(&data, 3).unwrap();
        c.extend_from_slice(&[0u8; 100]);
        assert_eq!(inflate_cluster(Compression::Zstd, &c, 4096).unwrap(), data);
        assert!(inflate_cluster(Compression::Zstd, &c[..10], 4096).is_err());
        assert!(inflate_cluster(Compression::Zstd, &c, 8192).is_err());
        // The thread's reused decoder starts clean after a failure.
        assert_eq!(inflate_cluster(Compression::Zstd, &c, 4096).unwrap(), data);
    }

    #[test]
    fn read_len_is_clamped() {
        let d = CompressedDescriptor {
            host_offset: 1000,
            max_len: 5000,
        };
        assert_eq!(compressed_read_len(&d, 3000), 2000);
        assert_eq!(compressed_read_len(&d, 100), 0);
        assert_eq!(compressed_read_len(&d, 1 << 20), 5000);
    }
}
