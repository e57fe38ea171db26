//! Encoding the server's replies: simple replies and structured reply
//! chunks. Each function appends the header (and the small payload
//! fields) to `out`; a READ's data is queued after it by the caller, so
//! it is never copied into the header buffer.

use crate::wire::consts::chunk;
use crate::wire::{ChunkHeader, SimpleReplyHeader};

/// A simple reply (`error` 0 for success; a READ's data follows).
pub fn simple(out: &mut Vec<u8>, cookie: u64, error: u32) {
    SimpleReplyHeader::new(error, cookie).encode(out);
}

/// The header of an OFFSET_DATA chunk carrying `len` bytes at `offset`;
/// the data itself follows.
pub fn data_chunk(out: &mut Vec<u8>, cookie: u64, offset: u64, len: u32, done: bool) {
    let flags = if done { chunk::FLAG_DONE } else { 0 };
    ChunkHeader::new(flags, chunk::OFFSET_DATA, cookie, len + 8).encode(out);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// An OFFSET_HOLE chunk: `len` bytes at `offset` read as zeroes.
pub fn hole_chunk(out: &mut Vec<u8>, cookie: u64, offset: u64, len: u32, done: bool) {
    let flags = if done { chunk::FLAG_DONE } else { 0 };
    ChunkHeader::new(flags, chunk::OFFSET_HOLE, cookie, 12).encode(out);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// The final NONE chunk (a success without data).
pub fn done_chunk(out: &mut Vec<u8>, cookie: u64) {
    ChunkHeader::new(chunk::FLAG_DONE, chunk::NONE, cookie, 0).encode(out);
}

/// A final ERROR chunk with a message (cut to the protocol's 4096 bytes).
pub fn error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    ChunkHeader::new(chunk::FLAG_DONE, chunk::ERROR, cookie, 6 + msg.len() as u32).encode(out);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

/// A final BLOCK_STATUS chunk: `(length, flags)` extents of `context`.
pub fn block_status_chunk(out: &mut Vec<u8>, cookie: u64, context: u32, extents: &[(u32, u32)]) {
    block_status_part(out, cookie, context, extents, true);
}

/// A BLOCK_STATUS chunk of one of several selected contexts (one chunk
/// per context; `done` on the last).
pub fn block_status_part(
    out: &mut Vec<u8>,
    cookie: u64,
    context: u32,
    extents: &[(u32, u32)],
    done: bool,
) {
    let len = 4 + 8 * extents.len() as u32;
    let flags = if done { chunk::FLAG_DONE } else { 0 };
    ChunkHeader::new(flags, chunk::BLOCK_STATUS, cookie, len).encode(out);
    out.extend_from_slice(&context.to_be_bytes());
    for (l, f) in extents {
        out.extend_from_slice(&l.to_be_bytes());
        out.extend_from_slice(&f.to_be_bytes());
    }
}

/// An error answer in whichever form the session uses.
pub fn error(out: &mut Vec<u8>, structured: bool, cookie: u64, error: u32, message: &str) {
    if structured {
        error_chunk(out, cookie, error, message);
    } else {
        simple(out, cookie, error);
    }
}

/// A success without data: a simple reply in both modes (the protocol
/// allows it for every command but READ, and QEMU's server does this).
pub fn ok(out: &mut Vec<u8>, cookie: u64) {
    simple(out, cookie, 0);
}
