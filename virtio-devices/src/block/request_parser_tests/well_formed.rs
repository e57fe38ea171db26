//! Well-formed chains of every request type in several layouts, and the
//! disk work the parser makes of them.

use super::*;

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
