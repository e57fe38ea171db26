use super::*;

const SIZE: u64 = 1 << 20;

fn rules(writable: bool) -> Rules {
    Rules {
        size: SIZE,
        writable,
        structured: true,
        block_status: true,
        max_payload: 1 << 16,
    }
}

fn hdr(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::new();
    RequestHeader::new(kind, flags, cookie, offset, len).encode(&mut b);
    b
}

fn parse_bytewise(p: &mut RequestParser, bytes: &[u8]) -> Vec<Parsed> {
    let mut out = Vec::new();
    for b in bytes {
        p.feed(std::slice::from_ref(b), &mut out).unwrap();
    }
    out
}

fn error_of(p: &Parsed) -> u32 {
    match p {
        Parsed::Reject { error, .. } => *error,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn requests_split_anywhere_come_out_whole() {
    let mut bytes = hdr(cmd::READ, 0, 1, 4096, 512);
    bytes.extend(hdr(cmd::WRITE, cmd_flag::FUA, 2, 0, 5));
    bytes.extend_from_slice(b"hello");
    bytes.extend(hdr(cmd::FLUSH, 0, 3, 0, 0));
    let mut p = RequestParser::new(rules(true));
    let out = parse_bytewise(&mut p, &bytes);
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(
        out[1],
        Parsed::Request(Request {
            cookie: 2,
            flags: cmd_flag::FUA,
            offset: 0,
            len: 5,
            command: Command::Write(b"hello".to_vec()),
        })
    );
    assert!(p.is_idle());
    // The same bytes in one piece give the same requests.
    let mut p = RequestParser::new(rules(true));
    let mut whole = Vec::new();
    p.feed(&bytes, &mut whole).unwrap();
    assert_eq!(whole, out);
}

#[test]
fn bad_requests_get_the_protocols_errors() {
    let mut p = RequestParser::new(rules(false));
    let mut bytes = hdr(cmd::WRITE, 0, 1, 0, 4);
    bytes.extend_from_slice(b"data");
    bytes.extend(hdr(cmd::TRIM, 0, 2, 0, 512));
    bytes.extend(hdr(cmd::READ, 0, 3, SIZE - 1, 2));
    bytes.extend(hdr(cmd::READ, cmd_flag::NO_HOLE, 4, 0, 2));
    bytes.extend(hdr(99, 0, 5, 0, 0));
    bytes.extend(hdr(cmd::READ, 0, 6, 0, (1 << 16) + 1));
    bytes.extend(hdr(cmd::BLOCK_STATUS, 0, 7, 0, 0));
    bytes.extend(hdr(cmd::READ, 0, 8, u64::MAX, 1));
    let mut out = Vec::new();
    p.feed(&bytes, &mut out).unwrap();
    let errors: Vec<u32> = out.iter().map(error_of).collect();
    assert_eq!(
        errors,
        [
            error::EPERM,
            error::EPERM,
            error::EINVAL,
            error::EINVAL,
            error::EINVAL,
            error::EINVAL,
            error::EINVAL,
            error::EINVAL
        ]
    );
    // A write past the end of a writable export is ENOSPC, after its
    // payload was read (the next request still parses).
    let mut p = RequestParser::new(rules(true));
    let mut bytes = hdr(cmd::WRITE, 0, 1, SIZE - 2, 4);
    bytes.extend_from_slice(b"data");
    bytes.extend(hdr(
        cmd::WRITE_ZEROES,
        cmd_flag::NO_HOLE | cmd_flag::FAST_ZERO,
        2,
        0,
        8,
    ));
    let mut out = Vec::new();
    p.feed(&bytes, &mut out).unwrap();
    assert_eq!(error_of(&out[0]), error::ENOSPC);
    assert!(matches!(&out[1], Parsed::Request(r) if r.command == Command::WriteZeroes));
}

#[test]
fn framing_errors_end_the_connection() {
    let mut p = RequestParser::new(rules(true));
    let mut bad = hdr(cmd::READ, 0, 1, 0, 1);
    bad[0] ^= 0xff;
    assert!(matches!(
        p.feed(&bad, &mut Vec::new()),
        Err(ProtocolViolation::Magic(_))
    ));
    assert_eq!(
        p.feed(b"x", &mut Vec::new()),
        Err(ProtocolViolation::AfterClose)
    );

    // An oversized write is answered, then nothing more is read.
    let mut p = RequestParser::new(rules(true));
    let mut out = Vec::new();
    p.feed(&hdr(cmd::WRITE, 0, 9, 0, u32::MAX), &mut out)
        .unwrap();
    assert!(matches!(
        out[0],
        Parsed::Reject {
            cookie: 9,
            close: true,
            ..
        }
    ));
    assert!(p.feed(&[0; 100], &mut out).is_err());

    let mut p = RequestParser::new(rules(true));
    let mut out = Vec::new();
    p.feed(&hdr(cmd::DISC, 0, 0, 0, 0), &mut out).unwrap();
    assert_eq!(out, [Parsed::Disconnect]);
}

#[test]
fn block_status_and_df_need_their_negotiation() {
    let mut r = rules(true);
    r.structured = false;
    r.block_status = false;
    let mut p = RequestParser::new(r);
    let mut out = Vec::new();
    p.feed(&hdr(cmd::BLOCK_STATUS, 0, 1, 0, 512), &mut out)
        .unwrap();
    p.feed(&hdr(cmd::READ, cmd_flag::DF, 2, 0, 512), &mut out)
        .unwrap();
    assert_eq!(error_of(&out[0]), error::EINVAL);
    assert_eq!(error_of(&out[1]), error::EINVAL);
}
