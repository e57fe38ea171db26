//! The virtio-blk request parser: turns one guest descriptor chain into a
//! validated request, or into the status the guest gets back.
//!
//! Data enters as a [`virtio_queue::DescriptorChain`] (or, for tests and
//! the fuzz target, a list of [`ChainDescriptor`]s) plus the guest memory
//! it points into. It leaves as a [`ParsedChain`]: either work for the
//! disk (op, byte offset, guest segments each inside one memory region),
//! a GET_ID answer, an immediate error status, or "unanswerable" when the
//! chain has no device-writable status byte (returned with used length 0).
//!
//! The parser does not assume a descriptor layout (virtio 1.2, 2.7.4): the
//! 16-byte header is the first bytes of the device-readable part, the
//! status is the last byte of the device-writable part, and data may be
//! split over descriptors in any way. It never panics and allocates at
//! most `seg_max` + a few entries per chain, whatever the guest wrote.

use std::ops::Deref;

use block::request::GuestSegment;
use block::{RequestOp, SECTOR_SIZE};
use thiserror::Error;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
    VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use virtio_queue::DescriptorChain;
use vm_memory::{
    Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryError, GuestMemoryMmap,
    GuestMemoryRegion,
};

pub use super::descriptor_walk::{walk_chain, walk_chain_into, ChainDescriptor, WalkedChain};

/// Size of `struct virtio_blk_outhdr` (type, reserved/ioprio, sector).
pub const HEADER_LEN: u64 = 16;
/// Size of one `struct virtio_blk_discard_write_zeroes` segment.
pub const DISCARD_SEGMENT_LEN: u64 = 16;
/// Bytes of a GET_ID answer.
pub const DEVICE_ID_LEN: usize = 20;

/// What the device knows when it validates a request.
#[derive(Clone, Copy, Debug)]
pub struct ParserLimits {
    /// Disk capacity in 512-byte sectors.
    pub capacity_sectors: u64,
    /// Most data segments per IN/OUT request.
    pub seg_max: u32,
    pub readonly: bool,
    /// Most sectors per discard or write-zeroes segment.
    pub max_discard_sectors: u32,
    /// Most segments per discard or write-zeroes request.
    pub max_discard_seg: u32,
}

impl ParserLimits {
    /// How many descriptors a walk needs to keep for these limits: the
    /// data segments plus header, status and slack for split headers.
    pub fn descriptors_to_keep(&self) -> usize {
        usize::try_from(self.seg_max)
            .unwrap_or(usize::MAX)
            .saturating_add(8)
    }
}

/// Why a chain cannot be answered with a status byte.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChainError {
    #[error("descriptor chain is broken (loop, nested indirect table or unmapped descriptor)")]
    Broken,
    #[error("last descriptor is not device-writable or is empty: no status byte")]
    NoStatusDescriptor,
    #[error("status byte at {0:#x} is outside guest memory")]
    StatusUnmapped(u64),
}

/// Why a request is refused; [`RequestError::status`] is what the guest sees.
#[derive(Debug, Error)]
pub enum RequestError {
    #[error("request header is {0} bytes, needs 16")]
    HeaderTooShort(u64),
    #[error("cannot read the request header")]
    ReadHeader(#[source] GuestMemoryError),
    #[error("a device-readable descriptor follows a device-writable one")]
    ReadableAfterWritable,
    #[error("{0} device-writable data bytes in a request that only reads guest memory")]
    UnexpectedWritableData(u64),
    #[error("{0} device-readable data bytes in a request that only writes guest memory")]
    UnexpectedReadableData(u64),
    #[error("data length {0} is not a multiple of 512")]
    LengthNotSectorMultiple(u64),
    #[error("sectors {sector}+{bytes} bytes lie beyond the capacity of {capacity} sectors")]
    BeyondCapacity {
        sector: u64,
        bytes: u64,
        capacity: u64,
    },
    #[error("{count} data segments, more than seg_max {max}")]
    TooManySegments { count: usize, max: u32 },
    #[error("write to a read-only disk")]
    ReadOnly,
    #[error("data range {addr:#x}+{len} is outside guest memory")]
    DataUnmapped { addr: u64, len: u64 },
    #[error("GET_ID without a device-writable buffer")]
    GetIdWithoutBuffer,
    #[error("discard/write-zeroes payload of {0} bytes is not a whole number of 16-byte segments")]
    DiscardPayloadLength(u64),
    #[error("{count} discard/write-zeroes segments, more than {max}")]
    TooManyDiscardSegments { count: u64, max: u32 },
    #[error("cannot read the discard/write-zeroes segment")]
    ReadDiscardSegment(#[source] GuestMemoryError),
    #[error("discard/write-zeroes segment has unknown flags {0:#x}")]
    UnknownDiscardFlags(u32),
    #[error("discard with the unmap flag set")]
    DiscardWithUnmap,
    #[error("discard/write-zeroes of {count} sectors, more than {max}")]
    DiscardTooLarge { count: u32, max: u32 },
    #[error("request type {0} is not supported")]
    UnsupportedType(u32),
}

impl RequestError {
    /// The virtio-blk status byte for this error.
    pub fn status(&self) -> u8 {
        let s = match self {
            RequestError::UnsupportedType(_)
            | RequestError::UnknownDiscardFlags(_)
            | RequestError::DiscardWithUnmap => VIRTIO_BLK_S_UNSUPP,
            _ => VIRTIO_BLK_S_IOERR,
        };
        s as u8
    }
}

/// What to do with a request whose status byte can be written.
#[derive(Debug)]
pub enum RequestWork {
    /// Hand to the disk. Read/Write carry `segments`; others none.
    Disk {
        op: RequestOp,
        offset: u64,
        segments: Vec<GuestSegment>,
    },
    /// Write the device ID into these segments (at most 20 bytes).
    GetId { segments: Vec<GuestSegment> },
    /// Nothing to do (zero-length request): status OK.
    Nothing,
    /// Refused: write `error.status()`.
    Reject(RequestError),
}

/// The outcome of parsing one chain.
#[derive(Debug)]
pub enum ParsedChain {
    /// The chain has no usable status byte: return it with used length 0.
    Unanswerable(ChainError),
    Request {
        /// Guest address of the status byte (checked to be mapped).
        status: GuestAddress,
        work: RequestWork,
    },
}

/// Parses a chain popped from a queue.
pub fn parse_chain<M>(
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<M>,
    limits: &ParserLimits,
) -> ParsedChain
where
    M: Deref,
    M::Target: GuestMemory,
{
    parse_chain_with(mem, chain, limits, &mut ParseScratch::default())
}

/// Segment lists kept for reuse at most.
const POOL_MAX: usize = 256;
/// Reused buffers larger than this many entries are shrunk back, so one
/// long chain does not pin memory.
const KEEP_CAPACITY: usize = 256;

/// Buffers the parser reuses from one chain to the next: a queue worker
/// keeps one, so parsing does not allocate in the steady state.
#[derive(Debug, Default)]
pub struct ParseScratch {
    walked: WalkedChain,
    parts: Parts,
    /// Segment lists handed back by completed requests.
    pool: Vec<Vec<GuestSegment>>,
}

impl ParseScratch {
    /// Takes back the segment list of a completed request for reuse.
    pub fn recycle(&mut self, mut segments: Vec<GuestSegment>) {
        if self.pool.len() < POOL_MAX && segments.capacity() <= KEEP_CAPACITY {
            segments.clear();
            self.pool.push(segments);
        }
    }

    fn trim(&mut self) {
        self.walked.descriptors.shrink_to(KEEP_CAPACITY);
        self.parts.readable.shrink_to(KEEP_CAPACITY);
        self.parts.writable.shrink_to(KEEP_CAPACITY);
    }
}

/// Like [`parse_chain`], reusing `scratch`'s buffers.
pub fn parse_chain_with<M>(
    mem: &GuestMemoryMmap,
    chain: DescriptorChain<M>,
    limits: &ParserLimits,
    scratch: &mut ParseScratch,
) -> ParsedChain
where
    M: Deref,
    M::Target: GuestMemory,
{
    walk_chain_into(chain, limits.descriptors_to_keep(), &mut scratch.walked);
    let parsed = parse_walked_in(
        mem,
        &scratch.walked,
        limits,
        &mut scratch.parts,
        &mut scratch.pool,
    );
    scratch.trim();
    parsed
}

/// Parses a walked chain.
pub fn parse_walked(
    mem: &GuestMemoryMmap,
    chain: &WalkedChain,
    limits: &ParserLimits,
) -> ParsedChain {
    parse_walked_in(mem, chain, limits, &mut Parts::default(), &mut Vec::new())
}

fn parse_walked_in(
    mem: &GuestMemoryMmap,
    chain: &WalkedChain,
    limits: &ParserLimits,
    parts: &mut Parts,
    pool: &mut Vec<Vec<GuestSegment>>,
) -> ParsedChain {
    if !chain.complete {
        return ParsedChain::Unanswerable(ChainError::Broken);
    }
    let last = match chain.last {
        Some(d) if d.writable && d.len > 0 => d,
        _ => return ParsedChain::Unanswerable(ChainError::NoStatusDescriptor),
    };
    let status_addr = match last.addr.checked_add(u64::from(last.len) - 1) {
        Some(a) if mem.address_in_range(GuestAddress(a)) => GuestAddress(a),
        Some(a) => return ParsedChain::Unanswerable(ChainError::StatusUnmapped(a)),
        None => return ParsedChain::Unanswerable(ChainError::StatusUnmapped(last.addr)),
    };
    let work = match parse_request(mem, chain, limits, parts, pool) {
        Ok(work) => work,
        Err(e) => RequestWork::Reject(e),
    };
    ParsedChain::Request {
        status: status_addr,
        work,
    }
}

/// The device-readable part and the device-writable part (minus the
/// status byte) of a chain, as byte ranges.
#[derive(Debug, Default)]
struct Parts {
    readable: Vec<(u64, u64)>,
    writable: Vec<(u64, u64)>,
}

fn split_parts(chain: &WalkedChain, parts: &mut Parts) -> Result<(), RequestError> {
    parts.readable.clear();
    parts.writable.clear();
    let mut seen_writable = false;
    for d in &chain.descriptors {
        if d.writable {
            seen_writable = true;
            parts.writable.push((d.addr, u64::from(d.len)));
        } else if seen_writable {
            return Err(RequestError::ReadableAfterWritable);
        } else {
            parts.readable.push((d.addr, u64::from(d.len)));
        }
    }
    // A chain longer than what was kept is only used to report "too many
    // segments", so the ranges past the cut do not matter; but its status
    // byte is the chain's last descriptor, not the last one kept.
    if chain.total == chain.descriptors.len() {
        if let Some(last) = parts.writable.last_mut() {
            last.1 -= 1;
            if last.1 == 0 {
                parts.writable.pop();
            }
        }
    }
    Ok(())
}

/// The byte ranges of `ranges` after skipping `skip` bytes.
fn ranges_after(ranges: &[(u64, u64)], mut skip: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(addr, len) in ranges {
        if skip >= len {
            skip -= len;
            continue;
        }
        out.push((addr.wrapping_add(skip), len - skip));
        skip = 0;
    }
    out.retain(|r| r.1 > 0);
    out
}

fn total_len(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|r| r.1).sum()
}

/// Reads `buf.len()` bytes gathered from the start of `ranges`.
fn read_gather(
    mem: &GuestMemoryMmap,
    ranges: &[(u64, u64)],
    buf: &mut [u8],
) -> Result<(), GuestMemoryError> {
    let mut done = 0usize;
    for &(addr, len) in ranges {
        if done == buf.len() {
            break;
        }
        let n = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .min(buf.len() - done);
        mem.read_slice(&mut buf[done..done + n], GuestAddress(addr))?;
        done += n;
    }
    if done < buf.len() {
        return Err(GuestMemoryError::PartialBuffer {
            expected: buf.len(),
            completed: done,
        });
    }
    Ok(())
}

/// Converts byte ranges to guest segments that each lie inside one mapped
/// region (a range crossing a region boundary is split).
pub fn to_guest_segments(
    mem: &GuestMemoryMmap,
    ranges: &[(u64, u64)],
) -> Result<Vec<GuestSegment>, RequestError> {
    let mut out = Vec::with_capacity(ranges.len());
    to_guest_segments_into(mem, ranges, &mut out)?;
    Ok(out)
}

/// Like [`to_guest_segments`], appending to `out`.
fn to_guest_segments_into(
    mem: &GuestMemoryMmap,
    ranges: &[(u64, u64)],
    out: &mut Vec<GuestSegment>,
) -> Result<(), RequestError> {
    for &(addr, len) in ranges {
        let unmapped = RequestError::DataUnmapped { addr, len };
        let mut at = addr;
        let mut left = len;
        while left > 0 {
            let region = mem
                .find_region(GuestAddress(at))
                .ok_or(RequestError::DataUnmapped { addr, len })?;
            let in_region = (region.last_addr().0 - at).saturating_add(1);
            let n = left.min(in_region).min(u64::from(u32::MAX));
            let n32 = u32::try_from(n).map_err(|_| RequestError::DataUnmapped { addr, len })?;
            out.push(GuestSegment {
                addr: GuestAddress(at),
                len: n32,
            });
            left -= n;
            at = match at.checked_add(n) {
                Some(next) => next,
                None if left == 0 => at,
                None => return Err(unmapped),
            };
        }
    }
    Ok(())
}

fn check_range(limits: &ParserLimits, sector: u64, bytes: u64) -> Result<u64, RequestError> {
    let capacity = limits.capacity_sectors.saturating_mul(SECTOR_SIZE);
    let span = sector
        .checked_mul(SECTOR_SIZE)
        .and_then(|offset| offset.checked_add(bytes).map(|end| (offset, end)));
    match span {
        Some((offset, end)) if end <= capacity => Ok(offset),
        _ => Err(RequestError::BeyondCapacity {
            sector,
            bytes,
            capacity: limits.capacity_sectors,
        }),
    }
}

fn parse_request(
    mem: &GuestMemoryMmap,
    chain: &WalkedChain,
    limits: &ParserLimits,
    parts: &mut Parts,
    pool: &mut Vec<Vec<GuestSegment>>,
) -> Result<RequestWork, RequestError> {
    split_parts(chain, parts)?;
    let readable_len = total_len(&parts.readable);
    if readable_len < HEADER_LEN {
        return Err(RequestError::HeaderTooShort(readable_len));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    read_gather(mem, &parts.readable, &mut header).map_err(RequestError::ReadHeader)?;
    let request_type = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let mut sector_bytes = [0u8; 8];
    sector_bytes.copy_from_slice(&header[8..16]);
    let sector = u64::from_le_bytes(sector_bytes);
    let out_data = ranges_after(&parts.readable, HEADER_LEN);
    let in_data = &parts.writable;
    let too_long = chain.total > chain.descriptors.len();

    match request_type {
        VIRTIO_BLK_T_IN | VIRTIO_BLK_T_OUT => {
            let is_read = request_type == VIRTIO_BLK_T_IN;
            let (data, other) = if is_read {
                (in_data, &out_data)
            } else {
                (&out_data, in_data)
            };
            if !other.is_empty() {
                let n = total_len(other);
                return Err(if is_read {
                    RequestError::UnexpectedReadableData(n)
                } else {
                    RequestError::UnexpectedWritableData(n)
                });
            }
            let max = limits.seg_max;
            if too_long || data.len() > usize::try_from(max).unwrap_or(usize::MAX) {
                let count = if too_long { chain.total } else { data.len() };
                return Err(RequestError::TooManySegments { count, max });
            }
            let len = total_len(data);
            if !len.is_multiple_of(SECTOR_SIZE) {
                return Err(RequestError::LengthNotSectorMultiple(len));
            }
            if !is_read && limits.readonly {
                return Err(RequestError::ReadOnly);
            }
            let offset = check_range(limits, sector, len)?;
            let mut segments = pool.pop().unwrap_or_default();
            to_guest_segments_into(mem, data, &mut segments)?;
            if len == 0 {
                return Ok(RequestWork::Nothing);
            }
            let op = if is_read {
                RequestOp::Read
            } else {
                RequestOp::Write
            };
            Ok(RequestWork::Disk {
                op,
                offset,
                segments,
            })
        }
        VIRTIO_BLK_T_FLUSH => {
            if !out_data.is_empty() {
                return Err(RequestError::UnexpectedReadableData(total_len(&out_data)));
            }
            if !in_data.is_empty() {
                return Err(RequestError::UnexpectedWritableData(total_len(in_data)));
            }
            Ok(RequestWork::Disk {
                op: RequestOp::Flush,
                offset: 0,
                segments: Vec::new(),
            })
        }
        VIRTIO_BLK_T_GET_ID => {
            if !out_data.is_empty() {
                return Err(RequestError::UnexpectedReadableData(total_len(&out_data)));
            }
            if in_data.is_empty() || too_long {
                return Err(RequestError::GetIdWithoutBuffer);
            }
            let mut left = DEVICE_ID_LEN as u64;
            let mut ranges = Vec::new();
            for &(addr, len) in in_data {
                if left == 0 {
                    break;
                }
                let n = len.min(left);
                ranges.push((addr, n));
                left -= n;
            }
            let segments = to_guest_segments(mem, &ranges)?;
            Ok(RequestWork::GetId { segments })
        }
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
            parse_discard(mem, request_type, &out_data, in_data, too_long, limits)
        }
        other => Err(RequestError::UnsupportedType(other)),
    }
}

fn parse_discard(
    mem: &GuestMemoryMmap,
    request_type: u32,
    out_data: &[(u64, u64)],
    in_data: &[(u64, u64)],
    too_long: bool,
    limits: &ParserLimits,
) -> Result<RequestWork, RequestError> {
    if !in_data.is_empty() {
        return Err(RequestError::UnexpectedWritableData(total_len(in_data)));
    }
    let payload = total_len(out_data);
    if payload == 0 || !payload.is_multiple_of(DISCARD_SEGMENT_LEN) || too_long {
        return Err(RequestError::DiscardPayloadLength(payload));
    }
    let count = payload / DISCARD_SEGMENT_LEN;
    if count > u64::from(limits.max_discard_seg) {
        return Err(RequestError::TooManyDiscardSegments {
            count,
            max: limits.max_discard_seg,
        });
    }
    // max_discard_seg is 1: one segment, one disk request.
    let mut seg = [0u8; DISCARD_SEGMENT_LEN as usize];
    read_gather(mem, out_data, &mut seg).map_err(RequestError::ReadDiscardSegment)?;
    let mut sector_bytes = [0u8; 8];
    sector_bytes.copy_from_slice(&seg[0..8]);
    let sector = u64::from_le_bytes(sector_bytes);
    let num_sectors = u32::from_le_bytes([seg[8], seg[9], seg[10], seg[11]]);
    let flags = u32::from_le_bytes([seg[12], seg[13], seg[14], seg[15]]);
    if flags & !VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0 {
        return Err(RequestError::UnknownDiscardFlags(flags));
    }
    let unmap = flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0;
    if request_type == VIRTIO_BLK_T_DISCARD && unmap {
        return Err(RequestError::DiscardWithUnmap);
    }
    if limits.readonly {
        return Err(RequestError::ReadOnly);
    }
    if num_sectors > limits.max_discard_sectors {
        return Err(RequestError::DiscardTooLarge {
            count: num_sectors,
            max: limits.max_discard_sectors,
        });
    }
    let len = u64::from(num_sectors) * SECTOR_SIZE;
    let offset = check_range(limits, sector, len)?;
    if len == 0 {
        return Ok(RequestWork::Nothing);
    }
    let op = if request_type == VIRTIO_BLK_T_DISCARD {
        RequestOp::Discard { len }
    } else {
        RequestOp::WriteZeroes {
            len,
            may_unmap: unmap,
        }
    };
    Ok(RequestWork::Disk {
        op,
        offset,
        segments: Vec::new(),
    })
}

#[cfg(test)]
#[path = "request_parser_tests/mod.rs"]
mod tests;
