//! Unit tests of the header parser, and a sample header other modules'
//! tests build on.

use super::*;

/// A valid v3 header cluster of 64 KiB with tables at clusters 1..3.
pub(crate) fn sample() -> (Vec<u8>, u64) {
    let h = Header {
        version: 3,
        backing_file_offset: 0,
        backing_file_size: 0,
        cluster_bits: 16,
        size: 1 << 30,
        crypt_method: 0,
        l1_size: 2,
        l1_table_offset: 3 << 16,
        refcount_table_offset: 1 << 16,
        refcount_table_clusters: 1,
        nb_snapshots: 0,
        snapshots_offset: 0,
        incompatible: 0,
        compatible: 0,
        autoclear: 0,
        refcount_order: 4,
        header_length: V3_HEADER_LEN,
        compression: Compression::Deflate,
        backing_file: None,
        backing_format: None,
        data_file: None,
        bitmaps: None,
    };
    let mut b = h.encode_fixed();
    b.resize(1 << 16, 0);
    (b, 4 << 16)
}

fn set32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

fn set64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_be_bytes());
}

fn err(b: &[u8], fs: u64) -> HeaderError {
    Header::parse(b, fs).unwrap_err()
}

#[test]
fn sample_parses() {
    let (b, fs) = sample();
    let h = Header::parse(&b, fs).unwrap();
    assert_eq!(h.cluster_size(), 65536);
    assert_eq!(h.l2_coverage(), 512 << 20);
    assert!(!h.extended_l2());
}

#[test]
fn truncated_header_is_refused() {
    let (b, fs) = sample();
    assert!(matches!(err(&b[..50], fs), HeaderError::Invalid(r) if r.contains("truncated")));
    assert!(matches!(err(&b[..80], fs), HeaderError::Invalid(r) if r.contains("truncated")));
}

#[test]
fn bad_magic_and_version() {
    let (mut b, fs) = sample();
    b[0] = b'X';
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("magic")));
    let (mut b, fs) = sample();
    set32(&mut b, 4, 4);
    assert!(matches!(err(&b, fs), HeaderError::Unsupported(r) if r.contains("version 4")));
}

#[test]
fn cluster_bits_out_of_range() {
    for bits in [0, 8, 22, 63, u32::MAX] {
        let (mut b, fs) = sample();
        set32(&mut b, 20, bits);
        assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("cluster_bits")));
    }
}

#[test]
fn header_length_checked() {
    let (mut b, fs) = sample();
    set32(&mut b, 100, 96);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("too small")));
    set32(&mut b, 100, 1 << 20);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("larger")));
}

#[test]
fn l1_checks() {
    let (mut b, fs) = sample();
    set32(&mut b, 36, 1);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("too small")));
    let (mut b, fs) = sample();
    set32(&mut b, 36, u32::MAX);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("absurd")));
    let (mut b, fs) = sample();
    set64(&mut b, 40, 100 << 16);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("beyond")));
    let (mut b, fs) = sample();
    set64(&mut b, 40, 0);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("L1 table offset")));
}

#[test]
fn refcount_table_checks() {
    let (mut b, fs) = sample();
    set64(&mut b, 48, 0);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("overlapping the header")));
    let (mut b, fs) = sample();
    set32(&mut b, 56, 10);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("beyond")));
    let (mut b, fs) = sample();
    set32(&mut b, 56, u32::MAX);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("absurd")));
    let (mut b, fs) = sample();
    set32(&mut b, 96, 7);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("refcount_order")));
}

#[test]
fn features_refused_by_name() {
    let (mut b, fs) = sample();
    set32(&mut b, 32, 2);
    assert!(matches!(err(&b, fs), HeaderError::Unsupported(r) if r.contains("encryption")));
    let (mut b, fs) = sample();
    set64(&mut b, 72, 1 << 9);
    assert!(matches!(err(&b, fs), HeaderError::Unsupported(r) if r.contains("bit 9")));
    let (mut b, fs) = sample();
    set64(&mut b, 72, INCOMPAT_COMPRESSION);
    b[104] = 7;
    assert!(matches!(err(&b, fs), HeaderError::Unsupported(r) if r.contains("compression type 7")));
}

#[test]
fn backing_name_bounds() {
    let (mut b, fs) = sample();
    set64(&mut b, 8, 65530);
    set32(&mut b, 16, 100);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("outside")));
    set32(&mut b, 16, 5000);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("length")));
    let (mut b, fs) = sample();
    set64(&mut b, 8, 200);
    set32(&mut b, 16, 4);
    b[200..204].copy_from_slice(b"base");
    assert_eq!(
        Header::parse(&b, fs).unwrap().backing_file.as_deref(),
        Some("base")
    );
}

#[test]
fn extension_past_cluster_refused() {
    let (mut b, fs) = sample();
    set32(&mut b, 112, EXT_BACKING_FORMAT);
    set32(&mut b, 116, 1 << 20);
    assert!(matches!(err(&b, fs), HeaderError::Invalid(r) if r.contains("extension")));
    set32(&mut b, 116, 3);
    b[120..123].copy_from_slice(b"raw");
    assert_eq!(
        Header::parse(&b, fs).unwrap().backing_format.as_deref(),
        Some("raw")
    );
}
