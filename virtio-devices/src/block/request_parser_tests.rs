//! Unit tests of the request parser: well-formed chains of every type in
//! several layouts, and every kind of malformed chain.

use super::*;
use virtio_bindings::virtio_blk::VIRTIO_BLK_T_SCSI_CMD;

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

#[test]
fn read_in_three_descriptors() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_IN, 8);
    let p = parse(&m, vec![r(HDR, 16), w(DATA, 4096), w(STATUS, 1)], &limits());
    let (op, offset, segs, st) = disk_work(p);
    assert_eq!(op, RequestOp::Read);
    assert_eq!(offset, 8 * 512);
    assert_eq!(
        segs,
        vec![GuestSegment {
            addr: GuestAddress(DATA),
            len: 4096
        }]
    );
    assert_eq!(st, GuestAddress(STATUS));
}

#[test]
fn write_with_header_split_over_two_descriptors() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_OUT, 3);
    // Header bytes 0..8 at HDR, 8..16 at HDR+0x100.
    let mut h = [0u8; 8];
    m.read_slice(&mut h, GuestAddress(HDR + 8)).unwrap();
    m.write_slice(&h, GuestAddress(HDR + 0x100)).unwrap();
    let p = parse(
        &m,
        vec![r(HDR, 8), r(HDR + 0x100, 8), r(DATA, 1024), w(STATUS, 1)],
        &limits(),
    );
    let (op, offset, segs, _) = disk_work(p);
    assert_eq!(op, RequestOp::Write);
    assert_eq!(offset, 3 * 512);
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].len, 1024);
}

#[test]
fn header_and_data_in_one_descriptor_and_status_after_read_data() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_OUT, 0);
    let (_, _, segs, _) = disk_work(parse(&m, vec![r(HDR, 16 + 512), w(STATUS, 1)], &limits()));
    assert_eq!(
        segs,
        vec![GuestSegment {
            addr: GuestAddress(HDR + 16),
            len: 512
        }]
    );

    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let (op, _, segs, st) = disk_work(parse(&m, vec![r(HDR, 16), w(DATA, 513)], &limits()));
    assert_eq!(op, RequestOp::Read);
    assert_eq!(
        segs,
        vec![GuestSegment {
            addr: GuestAddress(DATA),
            len: 512
        }]
    );
    assert_eq!(st, GuestAddress(DATA + 512));
}

#[test]
fn header_too_short_is_ioerr() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let p = parse(&m, vec![r(HDR, 8), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::HeaderTooShort(8)),
            ..
        }
    ));
    assert_eq!(status(&p), IOERR);
    assert_eq!(status(&parse(&m, vec![w(STATUS, 1)], &limits())), IOERR);
}

#[test]
fn missing_or_read_only_status_is_unanswerable() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let p = parse(&m, vec![r(HDR, 16), r(STATUS, 1)], &limits());
    assert!(matches!(
        p,
        ParsedChain::Unanswerable(ChainError::NoStatusDescriptor)
    ));
    let p = parse(&m, vec![r(HDR, 16), w(STATUS, 0)], &limits());
    assert!(matches!(
        p,
        ParsedChain::Unanswerable(ChainError::NoStatusDescriptor)
    ));
    let p = parse(&m, vec![], &limits());
    assert!(matches!(p, ParsedChain::Unanswerable(_)));
}

#[test]
fn status_outside_memory_is_unanswerable() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_FLUSH, 0);
    let p = parse(&m, vec![r(HDR, 16), w(MEM as u64, 1)], &limits());
    assert!(matches!(
        p,
        ParsedChain::Unanswerable(ChainError::StatusUnmapped(_))
    ));
    let p = parse(&m, vec![r(HDR, 16), w(u64::MAX, 16)], &limits());
    assert!(matches!(
        p,
        ParsedChain::Unanswerable(ChainError::StatusUnmapped(_))
    ));
}

#[test]
fn broken_chain_is_unanswerable() {
    let m = mem();
    let mut chain = WalkedChain::from_descriptors(vec![r(HDR, 16), w(STATUS, 1)]);
    chain.complete = false;
    assert!(matches!(
        parse_walked(&m, &chain, &limits()),
        ParsedChain::Unanswerable(ChainError::Broken)
    ));
}

#[test]
fn wrong_directions_are_ioerr() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_OUT, 0);
    let p = parse(&m, vec![r(HDR, 16), w(DATA, 512), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::UnexpectedWritableData(512)),
            ..
        }
    ));
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let p = parse(&m, vec![r(HDR, 16), r(DATA, 512), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::UnexpectedReadableData(512)),
            ..
        }
    ));
    let p = parse(
        &m,
        vec![r(HDR, 16), w(DATA, 512), r(DATA, 512), w(STATUS, 1)],
        &limits(),
    );
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::ReadableAfterWritable),
            ..
        }
    ));
}

#[test]
fn length_not_multiple_of_512_is_ioerr() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let p = parse(&m, vec![r(HDR, 16), w(DATA, 100), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::LengthNotSectorMultiple(100)),
            ..
        }
    ));
}

#[test]
fn beyond_capacity_is_ioerr_and_never_overflows() {
    let m = mem();
    for sector in [2047, 2048, u64::MAX / 512, u64::MAX] {
        header(&m, HDR, VIRTIO_BLK_T_IN, sector);
        let p = parse(&m, vec![r(HDR, 16), w(DATA, 1024), w(STATUS, 1)], &limits());
        assert!(
            matches!(
                &p,
                ParsedChain::Request {
                    work: RequestWork::Reject(RequestError::BeyondCapacity { .. }),
                    ..
                }
            ),
            "sector {sector}"
        );
    }
    header(&m, HDR, VIRTIO_BLK_T_IN, 2046);
    let (_, offset, _, _) = disk_work(parse(
        &m,
        vec![r(HDR, 16), w(DATA, 1024), w(STATUS, 1)],
        &limits(),
    ));
    assert_eq!(offset, 2046 * 512);
}

#[test]
fn more_segments_than_seg_max_is_ioerr() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let mut descs = vec![r(HDR, 16)];
    for i in 0..5 {
        descs.push(w(DATA + i * 512, 512));
    }
    descs.push(w(STATUS, 1));
    let p = parse(&m, descs.clone(), &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::TooManySegments { count: 5, max: 4 }),
            ..
        }
    ));
    // A chain longer than the walk keeps is refused the same way, and its
    // status byte is still the chain's last descriptor.
    let mut chain = WalkedChain::from_descriptors(descs);
    chain.descriptors.truncate(3);
    let p = parse_walked(&m, &chain, &limits());
    assert_eq!(status(&p), IOERR);
    assert!(matches!(p, ParsedChain::Request { status, .. } if status == GuestAddress(STATUS)));
}

#[test]
fn read_only_disk_refuses_writes_discards_and_zeroes() {
    let m = mem();
    let ro = ParserLimits {
        readonly: true,
        ..limits()
    };
    header(&m, HDR, VIRTIO_BLK_T_OUT, 0);
    let p = parse(&m, vec![r(HDR, 16), r(DATA, 512), w(STATUS, 1)], &ro);
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::ReadOnly),
            ..
        }
    ));
    for t in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        header(&m, HDR, t, 0);
        discard_segment(&m, 0, 8, 0);
        let p = parse(&m, vec![r(HDR, 16), r(DATA, 16), w(STATUS, 1)], &ro);
        assert!(matches!(
            &p,
            ParsedChain::Request {
                work: RequestWork::Reject(RequestError::ReadOnly),
                ..
            }
        ));
    }
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let (op, _, _, _) = disk_work(parse(&m, vec![r(HDR, 16), w(DATA, 512), w(STATUS, 1)], &ro));
    assert_eq!(op, RequestOp::Read);
}

#[test]
fn data_or_header_outside_memory_is_ioerr() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let p = parse(
        &m,
        vec![r(HDR, 16), w(MEM as u64 - 512, 1024), w(STATUS, 1)],
        &limits(),
    );
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::DataUnmapped { .. }),
            ..
        }
    ));
    let p = parse(&m, vec![r(u64::MAX - 8, 16), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::ReadHeader(_)),
            ..
        }
    ));
    let p = parse(
        &m,
        vec![r(HDR, 16), w(u64::MAX - 511, 512), w(STATUS, 1)],
        &limits(),
    );
    assert_eq!(status(&p), IOERR);
}

#[test]
fn unknown_types_are_unsupp() {
    let m = mem();
    for t in [VIRTIO_BLK_T_SCSI_CMD, 3, 14, 0xdead_beef] {
        header(&m, HDR, t, 0);
        let p = parse(&m, vec![r(HDR, 16), w(STATUS, 1)], &limits());
        assert_eq!(status(&p), UNSUPP, "type {t}");
    }
}

#[test]
fn flush_and_get_id() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_FLUSH, 12345);
    let (op, _, segs, _) = disk_work(parse(&m, vec![r(HDR, 16), w(STATUS, 1)], &limits()));
    assert_eq!(op, RequestOp::Flush);
    assert!(segs.is_empty());
    let p = parse(&m, vec![r(HDR, 16), w(DATA, 512), w(STATUS, 1)], &limits());
    assert_eq!(status(&p), IOERR);

    header(&m, HDR, VIRTIO_BLK_T_GET_ID, 0);
    let p = parse(&m, vec![r(HDR, 16), w(DATA, 512), w(STATUS, 1)], &limits());
    match p {
        ParsedChain::Request {
            work: RequestWork::GetId { segments },
            ..
        } => {
            assert_eq!(
                segments,
                vec![GuestSegment {
                    addr: GuestAddress(DATA),
                    len: 20
                }]
            );
        }
        other => panic!("{other:?}"),
    }
    let p = parse(
        &m,
        vec![
            r(HDR, 16),
            w(DATA, 8),
            w(DATA + 8, 8),
            w(DATA + 16, 8),
            w(STATUS, 1),
        ],
        &limits(),
    );
    match p {
        ParsedChain::Request {
            work: RequestWork::GetId { segments },
            ..
        } => {
            assert_eq!(
                segments.iter().map(|s| s.len).collect::<Vec<_>>(),
                vec![8, 8, 4]
            );
        }
        other => panic!("{other:?}"),
    }
    let p = parse(&m, vec![r(HDR, 16), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::GetIdWithoutBuffer),
            ..
        }
    ));
}

fn discard_segment(m: &GuestMemoryMmap, sector: u64, num: u32, flags: u32) {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&sector.to_le_bytes());
    s[8..12].copy_from_slice(&num.to_le_bytes());
    s[12..16].copy_from_slice(&flags.to_le_bytes());
    m.write_slice(&s, GuestAddress(DATA)).unwrap();
}

#[test]
fn discard_and_write_zeroes() {
    let m = mem();
    header(&m, HDR, VIRTIO_BLK_T_DISCARD, 0);
    discard_segment(&m, 16, 8, 0);
    let (op, offset, _, _) = disk_work(parse(
        &m,
        vec![r(HDR, 16), r(DATA, 16), w(STATUS, 1)],
        &limits(),
    ));
    assert_eq!(op, RequestOp::Discard { len: 4096 });
    assert_eq!(offset, 16 * 512);

    header(&m, HDR, VIRTIO_BLK_T_WRITE_ZEROES, 0);
    discard_segment(&m, 0, 2048, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    let (op, _, _, _) = disk_work(parse(
        &m,
        vec![r(HDR, 16), r(DATA, 16), w(STATUS, 1)],
        &limits(),
    ));
    assert_eq!(
        op,
        RequestOp::WriteZeroes {
            len: 1 << 20,
            may_unmap: true
        }
    );
    discard_segment(&m, 0, 1, 0);
    let (op, _, _, _) = disk_work(parse(
        &m,
        vec![r(HDR, 16), r(DATA, 16), w(STATUS, 1)],
        &limits(),
    ));
    assert_eq!(
        op,
        RequestOp::WriteZeroes {
            len: 512,
            may_unmap: false
        }
    );
    // Header and segment in one descriptor.
    m.write_slice(&[0u8; 16], GuestAddress(HDR + 16)).unwrap();
    let mut seg = [0u8; 16];
    m.read_slice(&mut seg, GuestAddress(DATA)).unwrap();
    m.write_slice(&seg, GuestAddress(HDR + 16)).unwrap();
    let (op, _, _, _) = disk_work(parse(&m, vec![r(HDR, 32), w(STATUS, 1)], &limits()));
    assert_eq!(
        op,
        RequestOp::WriteZeroes {
            len: 512,
            may_unmap: false
        }
    );
}

#[test]
fn bad_discard_segments() {
    let m = mem();
    let chain = || vec![r(HDR, 16), r(DATA, 16), w(STATUS, 1)];
    header(&m, HDR, VIRTIO_BLK_T_DISCARD, 0);
    discard_segment(&m, 0, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    let p = parse(&m, chain(), &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::DiscardWithUnmap),
            ..
        }
    ));
    assert_eq!(status(&p), UNSUPP);
    discard_segment(&m, 0, 8, 0x6);
    assert_eq!(status(&parse(&m, chain(), &limits())), UNSUPP);
    discard_segment(&m, 2047, 2, 0);
    let p = parse(&m, chain(), &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::BeyondCapacity { .. }),
            ..
        }
    ));
    discard_segment(&m, u64::MAX, u32::MAX, 0);
    assert_eq!(status(&parse(&m, chain(), &limits())), IOERR);
    let small = ParserLimits {
        max_discard_sectors: 4,
        ..limits()
    };
    discard_segment(&m, 0, 8, 0);
    let p = parse(&m, chain(), &small);
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::DiscardTooLarge { count: 8, max: 4 }),
            ..
        }
    ));
    // Two segments, a partial one, none, and a writable payload.
    let p = parse(&m, vec![r(HDR, 16), r(DATA, 32), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::TooManyDiscardSegments { count: 2, .. }),
            ..
        }
    ));
    let p = parse(&m, vec![r(HDR, 16), r(DATA, 8), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::DiscardPayloadLength(8)),
            ..
        }
    ));
    assert_eq!(
        status(&parse(&m, vec![r(HDR, 16), w(STATUS, 1)], &limits())),
        IOERR
    );
    let p = parse(&m, vec![r(HDR, 16), w(DATA, 16), w(STATUS, 1)], &limits());
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::UnexpectedWritableData(16)),
            ..
        }
    ));
    // Zero sectors: nothing to do, status OK.
    discard_segment(&m, 0, 0, 0);
    assert!(matches!(
        parse(&m, chain(), &limits()),
        ParsedChain::Request {
            work: RequestWork::Nothing,
            ..
        }
    ));
}

#[test]
fn data_crossing_memory_regions_is_split() {
    let m = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 0x10000),
        (GuestAddress(0x10000), 0x10000),
    ])
    .unwrap();
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let (_, _, segs, _) = disk_work(parse(
        &m,
        vec![r(HDR, 16), w(0xf000, 0x2000), w(STATUS, 1)],
        &limits(),
    ));
    assert_eq!(
        segs,
        vec![
            GuestSegment {
                addr: GuestAddress(0xf000),
                len: 0x1000
            },
            GuestSegment {
                addr: GuestAddress(0x10000),
                len: 0x1000
            },
        ]
    );
    // A hole between regions is refused.
    let m = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 0x10000),
        (GuestAddress(0x20000), 0x10000),
    ])
    .unwrap();
    header(&m, HDR, VIRTIO_BLK_T_IN, 0);
    let p = parse(
        &m,
        vec![r(HDR, 16), w(0xf000, 0x2000), w(STATUS, 1)],
        &limits(),
    );
    assert!(matches!(
        &p,
        ParsedChain::Request {
            work: RequestWork::Reject(RequestError::DataUnmapped { .. }),
            ..
        }
    ));
}

/// Deterministic random descriptor tables, rings and headers popped
/// through virtio-queue and parsed: a cheap, always-on cousin of the
/// cargo-fuzz target. Nothing may panic; every answer must stay inside
/// guest memory and the disk.
#[test]
fn random_rings_never_panic() {
    use virtio_queue::{Queue, QueueT};
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let types = [0u32, 1, 4, 8, 11, 13, 2, 14, 0xffff_ffff];
    let (mut disk, mut rejected, mut dropped) = (0, 0, 0);
    // One scratch for every chain, as a queue worker keeps it: reused
    // buffers must never change an outcome.
    let mut scratch = ParseScratch::default();
    for _ in 0..3000 {
        let m = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x8000),
            (GuestAddress(0x8000), 0x8000),
        ])
        .unwrap();
        let size: u16 = 8;
        let desc = |m: &GuestMemoryMmap,
                    table: u64,
                    i: u64,
                    addr: u64,
                    len: u32,
                    flags: u16,
                    next: u16| {
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&next.to_le_bytes());
            m.write_slice(&d, GuestAddress(table + 16 * i)).unwrap();
        };
        // Ring descriptor h points at an indirect table holding a mostly
        // well-formed request: header, 0-4 data descriptors, status.
        for h in 0..u64::from(size) {
            let table = 0x400 + h * 0x100;
            let hdr = 0x1000 + h * 0x1000;
            let t = types[rng.below(types.len() as u64) as usize];
            let mut b = [0u8; 16];
            b[0..4].copy_from_slice(&t.to_le_bytes());
            b[8..16].copy_from_slice(&rng.below(2100).to_le_bytes());
            m.write_slice(&b, GuestAddress(hdr)).unwrap();
            // A discard segment right after the header.
            let mut seg = [0u8; 16];
            seg[0..8].copy_from_slice(&rng.below(2100).to_le_bytes());
            seg[8..12].copy_from_slice(&(rng.below(80) as u32).to_le_bytes());
            seg[12..16].copy_from_slice(&(rng.below(3) as u32).to_le_bytes());
            m.write_slice(&seg, GuestAddress(hdr + 16)).unwrap();
            let n_data = rng.below(5);
            let writable = u16::from(matches!(t, 0 | 8)) * 2;
            desc(
                &m,
                table,
                0,
                hdr,
                if t == 11 || t == 13 { 32 } else { 16 },
                1,
                1,
            );
            for d in 0..n_data {
                let len = if rng.below(8) == 0 {
                    rng.below(700) as u32
                } else {
                    512 * (1 + rng.below(2) as u32)
                };
                desc(
                    &m,
                    table,
                    1 + d,
                    hdr + 0x100 + d * 0x400,
                    len,
                    1 | writable,
                    (2 + d) as u16,
                );
            }
            desc(&m, table, 1 + n_data, hdr + 0xff0, 1, 2, 0);
            desc(&m, 0, h, table, 16 * (2 + n_data as u32), 4, 0);
            // Now break something, sometimes.
            if rng.below(3) == 0 {
                let (tbl, i) = if rng.below(2) == 0 {
                    (table, rng.below(2 + n_data))
                } else {
                    (0, h)
                };
                let field = rng.below(4);
                let at = GuestAddress(tbl + 16 * i + [0, 8, 12, 14][field as usize]);
                match field {
                    0 => m.write_obj(rng.next(), at).unwrap(),
                    1 => m.write_obj(rng.next() as u32, at).unwrap(),
                    _ => m.write_obj(rng.below(16) as u16, at).unwrap(),
                }
            }
        }
        let avail = 0x200u64;
        let n_avail = rng.below(u64::from(size) + 2) as u16;
        m.write_obj(n_avail, GuestAddress(avail + 2)).unwrap();
        for i in 0..u64::from(size) {
            m.write_obj(rng.below(9) as u16, GuestAddress(avail + 4 + 2 * i))
                .unwrap();
        }
        let mut q = Queue::new(size).unwrap();
        q.set_size(size);
        q.set_desc_table_address(Some(0), Some(0));
        q.set_avail_ring_address(Some(avail as u32), Some(0));
        q.set_used_ring_address(Some(0x300), Some(0));
        q.set_ready(true);
        let l = ParserLimits {
            capacity_sectors: 2048,
            seg_max: 3,
            readonly: rng.below(2) == 0,
            max_discard_sectors: 64,
            max_discard_seg: 1,
        };
        while let Some(chain) = q.pop_descriptor_chain(&m) {
            let reused = parse_chain_with(&m, chain.clone(), &l, &mut scratch);
            let parsed = parse_chain(&m, chain, &l);
            assert_eq!(format!("{reused:?}"), format!("{parsed:?}"));
            if let ParsedChain::Request {
                work: RequestWork::Disk { segments, .. },
                ..
            } = reused
            {
                scratch.recycle(segments);
            }
            match parsed {
                ParsedChain::Unanswerable(_) => dropped += 1,
                ParsedChain::Request { status, work } => {
                    assert!(m.address_in_range(status));
                    if let RequestWork::Reject(_) = work {
                        rejected += 1;
                    }
                    if let RequestWork::Disk {
                        op,
                        offset,
                        segments,
                    } = work
                    {
                        disk += 1;
                        let data: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
                        let len = match op {
                            RequestOp::Discard { len } | RequestOp::WriteZeroes { len, .. } => len,
                            _ => data,
                        };
                        assert!(offset + len <= 2048 * 512);
                        assert!(segments.len() <= 6, "seg_max 3, each split at most once");
                        for s in &segments {
                            assert!(m.get_slice(s.addr, s.len as usize).is_ok());
                        }
                        if l.readonly {
                            assert!(
                                matches!(op, RequestOp::Read | RequestOp::Flush),
                                "{op:?} on a read-only disk"
                            );
                        }
                    }
                }
            }
        }
    }
    // The generator must reach every outcome, or the test proves little.
    assert!(
        disk > 10 && rejected > 10 && dropped > 10,
        "disk {disk} rejected {rejected} dropped {dropped}"
    );
}
