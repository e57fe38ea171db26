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
use zstd::stream::raw::{Decoder, Operation};

use super::l2_entry::CompressedDescriptor;
use crate::formats::Compression;

/// Bytes to read for a compressed cluster: the descriptor's length, never
/// past the end of the file (the last sector may be partial there).
pub(crate) fn compressed_read_len(desc: &CompressedDescriptor, file_size: u64) -> u64 {
    desc.max_len.min(file_size.saturating_sub(desc.host_offset))
}

/// Inflates `input` into `out`, which must be filled completely (one
/// cluster). Trailing bytes after the stream are ignored.
pub(crate) fn inflate_cluster(
    algorithm: Compression,
    input: &[u8],
    out: &mut [u8],
) -> Result<(), String> {
    match algorithm {
        Compression::Deflate => inflate_deflate(input, out),
        Compression::Zstd => inflate_zstd(input, out),
    }
}

// One decoder per thread, reset for every cluster: creating a zstd
// context per cluster cost more than decompressing it.
thread_local! {
    static DEFLATE: RefCell<Decompress> = RefCell::new(Decompress::new(false));
    static ZSTD: RefCell<Option<Decoder<'static>>> = const { RefCell::new(None) };
}

fn inflate_deflate(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    DEFLATE.with(|cell| {
        let mut d = cell.borrow_mut();
        d.reset(false);
        inflate_deflate_with(&mut d, input, out)
    })
}

fn inflate_deflate_with(d: &mut Decompress, input: &[u8], out: &mut [u8]) -> Result<(), String> {
    match d.decompress(input, out, FlushDecompress::Finish) {
        // qemu accepts a stream that filled the buffer without its end marker.
        Ok(Status::StreamEnd) | Ok(Status::Ok) | Ok(Status::BufError) => {}
        Err(e) => return Err(format!("deflate: {e}")),
    }
    if d.total_out() != out.len() as u64 {
        return Err(format!(
            "deflate stream inflates to {} bytes, expected {}",
            d.total_out(),
            out.len()
        ));
    }
    Ok(())
}

fn inflate_zstd(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    ZSTD.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = match slot.as_mut() {
            Some(d) => {
                d.reinit().map_err(|e| format!("zstd: {e}"))?;
                d
            }
            None => slot.insert(Decoder::new().map_err(|e| format!("zstd: {e}"))?),
        };
        inflate_zstd_with(d, input, out)
    })
}

fn inflate_zstd_with(d: &mut Decoder<'static>, input: &[u8], out: &mut [u8]) -> Result<(), String> {
    let (mut read, mut written) = (0usize, 0usize);
    // Each round consumes input or produces output, or we stop.
    while written < out.len() {
        let st = d
            .run_on_buffers(&input[read..], &mut out[written..])
            .map_err(|e| format!("zstd: {e}"))?;
        read += st.bytes_read;
        written += st.bytes_written;
        if st.remaining == 0 || (st.bytes_read == 0 && st.bytes_written == 0) {
            break;
        }
    }
    if written != out.len() {
        return Err(format!(
            "zstd stream inflates to {written} bytes, expected {}",
            out.len()
        ));
    }
    Ok(())
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
        let mut out = vec![0u8; 4096];
        inflate_cluster(Compression::Deflate, &c, &mut out).unwrap();
        assert_eq!(out, data);
        let mut big = vec![0u8; 8192];
        assert!(inflate_cluster(Compression::Deflate, &c, &mut big).is_err());
        assert!(inflate_cluster(Compression::Deflate, &[1, 2, 3], &mut out).is_err());
        out.fill(0);
        inflate_cluster(Compression::Deflate, &c, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn zstd_round_trip_with_trailing_garbage() {
        let data = sample();
        let mut c = zstd::bulk::compress(&data, 3).unwrap();
        c.extend_from_slice(&[0u8; 100]);
        let mut out = vec![0u8; 4096];
        inflate_cluster(Compression::Zstd, &c, &mut out).unwrap();
        assert_eq!(out, data);
        assert!(inflate_cluster(Compression::Zstd, &c[..10], &mut out).is_err());
        // The thread's reused decoder starts clean after a failure.
        out.fill(0);
        inflate_cluster(Compression::Zstd, &c, &mut out).unwrap();
        assert_eq!(out, data);
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
