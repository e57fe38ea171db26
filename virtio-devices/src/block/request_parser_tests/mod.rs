//! Unit tests of the request parser, by theme:
//! - [`well_formed`]: every request type in several layouts, and what the
//!   parser hands to the disk for it.
//! - [`malformed`]: every kind of malformed chain and the status it gets
//!   (or that it is unanswerable).
//! - [`random_rings`]: seeded random rings popped through virtio-queue,
//!   a cheap always-on cousin of the cargo-fuzz target.
//!
//! This file holds the guest memory layout and the chain builders they share.

mod malformed;
mod random_rings;
mod well_formed;

use super::*;

const MEM: usize = 1 << 20;
const HDR: u64 = 0x1000;
const DATA: u64 = 0x2000;
const STATUS: u64 = 0x9000;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM)]).unwrap()
}

fn limits() -> ParserLimits {
    ParserLimits {
        capacity_sectors: 2048,
        seg_max: 4,
        readonly: false,
        max_discard_sectors: 1 << 22,
        max_discard_seg: 1,
    }
}

fn header(m: &GuestMemoryMmap, at: u64, t: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&t.to_le_bytes());
    h[4..8].copy_from_slice(&0xdead_beefu32.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    m.write_slice(&h, GuestAddress(at)).unwrap();
}

fn r(addr: u64, len: u32) -> ChainDescriptor {
    ChainDescriptor {
        addr,
        len,
        writable: false,
    }
}

fn w(addr: u64, len: u32) -> ChainDescriptor {
    ChainDescriptor {
        addr,
        len,
        writable: true,
    }
}

fn parse(m: &GuestMemoryMmap, descs: Vec<ChainDescriptor>, l: &ParserLimits) -> ParsedChain {
    parse_walked(m, &WalkedChain::from_descriptors(descs), l)
}

/// The status byte the device would write (None: unanswerable; Some(0): OK).
fn status(p: &ParsedChain) -> Option<u8> {
    match p {
        ParsedChain::Unanswerable(_) => None,
        ParsedChain::Request { work, .. } => Some(match work {
            RequestWork::Reject(e) => e.status(),
            _ => 0,
        }),
    }
}

const IOERR: Option<u8> = Some(VIRTIO_BLK_S_IOERR as u8);
const UNSUPP: Option<u8> = Some(VIRTIO_BLK_S_UNSUPP as u8);

fn disk_work(p: ParsedChain) -> (RequestOp, u64, Vec<GuestSegment>, GuestAddress) {
    match p {
        ParsedChain::Request {
            status,
            work:
                RequestWork::Disk {
                    op,
                    offset,
                    segments,
                },
        } => (op, offset, segments, status),
        other => panic!("expected disk work, got {other:?}"),
    }
}

fn discard_segment(m: &GuestMemoryMmap, sector: u64, num: u32, flags: u32) {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&sector.to_le_bytes());
    s[8..12].copy_from_slice(&num.to_le_bytes());
    s[12..16].copy_from_slice(&flags.to_le_bytes());
    m.write_slice(&s, GuestAddress(DATA)).unwrap();
}
