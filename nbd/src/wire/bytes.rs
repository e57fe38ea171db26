//! Big-endian fields read out of byte slices and length-prefixed
//! strings written into them: what the headers ([`super::header`]) and
//! the handshake's option payloads are made of.

/// Reads a big-endian `u16` at `at` (the caller checked the length).
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian `u32` at `at` (the caller checked the length).
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a big-endian `u64` at `at` (the caller checked the length).
pub fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

/// Appends a length-prefixed (`u32`) string.
pub fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}
