//! Malformed chains: each kind, and the status the device answers with
//! (IOERR, UNSUPP) or that the chain is unanswerable.

use super::*;
use virtio_bindings::virtio_blk::VIRTIO_BLK_T_SCSI_CMD;

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
