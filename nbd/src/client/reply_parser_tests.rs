use super::*;
use crate::server::replies;

#[derive(Debug, PartialEq, Eq)]
enum Ev {
    Data(u64, u64, Vec<u8>),
    Hole(u64, u64, u32),
    Extents(u64, Vec<(u32, u32)>),
    Error(u64, i32, String),
    Done(u64),
}

/// Cookies 1..=9 are READs of 16 bytes at 100, 10 is a block status on
/// context 7, 11 a flush.
fn expect(cookie: u64) -> Option<Expect> {
    match cookie {
        1..=9 => Some(Expect::Read {
            offset: 100,
            len: 16,
        }),
        10 => Some(Expect::BlockStatus { context: 7 }),
        11 => Some(Expect::Other),
        _ => None,
    }
}

/// Feeds `bytes` in pieces of `step`, merging data pieces per cookie.
fn run(structured: bool, bytes: &[u8], step: usize) -> Result<Vec<Ev>, ReplyError> {
    let mut p = ReplyParser::new(structured);
    let mut evs = Vec::new();
    for piece in bytes.chunks(step) {
        p.feed(piece, &mut expect, &mut |e| {
            let ev = match e {
                ReplyEvent::Data { cookie, at, bytes } => {
                    if let Some(Ev::Data(c, a, d)) = evs.last_mut() {
                        if *c == cookie && *a + d.len() as u64 == at {
                            d.extend_from_slice(bytes);
                            return;
                        }
                    }
                    Ev::Data(cookie, at, bytes.to_vec())
                }
                ReplyEvent::Hole { cookie, at, len } => Ev::Hole(cookie, at, len),
                ReplyEvent::Extents {
                    cookie, extents, ..
                } => Ev::Extents(cookie, extents.iter().map(|e| (e.len, e.flags)).collect()),
                ReplyEvent::Error {
                    cookie,
                    errno,
                    message,
                } => Ev::Error(cookie, errno, message.into()),
                ReplyEvent::Done { cookie } => Ev::Done(cookie),
            };
            evs.push(ev);
        })?;
    }
    assert!(p.is_idle());
    Ok(evs)
}

#[test]
fn replies_in_any_split_give_the_same_events() {
    let mut b = Vec::new();
    replies::data_chunk(&mut b, 1, 104, 4, false);
    b.extend_from_slice(b"abcd");
    replies::hole_chunk(&mut b, 1, 100, 4, false);
    replies::data_chunk(&mut b, 1, 108, 8, true);
    b.extend_from_slice(b"efghijkl");
    replies::block_status_chunk(&mut b, 10, 7, &[(4096, 0), (512, 3)]);
    replies::error_chunk(&mut b, 2, 5, "disk on fire");
    replies::simple(&mut b, 11, 0);
    let want = vec![
        Ev::Data(1, 4, b"abcd".to_vec()),
        Ev::Hole(1, 0, 4),
        Ev::Data(1, 8, b"efghijkl".to_vec()),
        Ev::Done(1),
        Ev::Extents(10, vec![(4096, 0), (512, 3)]),
        Ev::Done(10),
        Ev::Error(2, libc::EIO, "disk on fire".into()),
        Ev::Done(2),
        Ev::Done(11),
    ];
    for step in [1, 3, 7, 20, b.len()] {
        assert_eq!(run(true, &b, step).unwrap(), want, "step {step}");
    }
}

#[test]
fn simple_replies_carry_read_data_by_the_request_length() {
    let mut b = Vec::new();
    replies::simple(&mut b, 3, 0);
    b.extend_from_slice(&[7u8; 16]);
    replies::simple(&mut b, 4, 22);
    let evs = run(false, &b, 5).unwrap();
    assert_eq!(
        evs,
        vec![
            Ev::Data(3, 0, vec![7; 16]),
            Ev::Done(3),
            Ev::Error(4, libc::EINVAL, String::new()),
            Ev::Done(4)
        ]
    );
}

#[test]
fn hostile_replies_are_protocol_errors() {
    let chunk = |flags, kind, cookie, payload: &[u8]| {
        let mut b = Vec::new();
        ChunkHeader::new(flags, kind, cookie, payload.len() as u32).encode(&mut b);
        b.extend_from_slice(payload);
        b
    };
    let off = |o: u64, rest: &[u8]| [&o.to_be_bytes()[..], rest].concat();
    let cases: Vec<(Vec<u8>, ReplyError)> = vec![
        (vec![0xde, 0xad, 0xbe, 0xef], ReplyError::Magic(0xdead_beef)),
        (
            chunk(1, chunk::NONE, 99, &[]),
            ReplyError::UnknownCookie(99),
        ),
        (
            chunk(1, chunk::OFFSET_DATA, 1, &off(90, &[0; 8])),
            ReplyError::OutOfRange { offset: 90, len: 8 },
        ),
        (
            chunk(1, chunk::OFFSET_DATA, 1, &off(110, &[0; 8])),
            ReplyError::OutOfRange {
                offset: 110,
                len: 8,
            },
        ),
        (
            chunk(1, chunk::OFFSET_DATA, 1, &off(100, &[0; 17])),
            ReplyError::ChunkLength {
                kind: chunk::OFFSET_DATA,
                len: 25,
            },
        ),
        (
            chunk(
                1,
                chunk::OFFSET_HOLE,
                1,
                &off(u64::MAX, &4u32.to_be_bytes()),
            ),
            ReplyError::OutOfRange {
                offset: u64::MAX,
                len: 4,
            },
        ),
        (
            chunk(1, chunk::OFFSET_DATA, 11, &off(100, &[0; 8])),
            ReplyError::ChunkType {
                kind: chunk::OFFSET_DATA,
                flags: 1,
                len: 16,
            },
        ),
        (
            chunk(
                1,
                chunk::BLOCK_STATUS,
                10,
                &[0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0],
            ),
            ReplyError::Context { got: 8, want: 7 },
        ),
        (
            chunk(1, chunk::BLOCK_STATUS, 10, &[0, 0, 0, 7, 0, 0, 0, 1]),
            ReplyError::ChunkLength {
                kind: chunk::BLOCK_STATUS,
                len: 8,
            },
        ),
        (
            chunk(1, chunk::ERROR, 2, &[0, 0, 0, 5, 0xff, 0xff]),
            ReplyError::ChunkLength {
                kind: chunk::ERROR,
                len: 6,
            },
        ),
        (
            chunk(1, chunk::ERROR, 2, &[0, 0, 0, 0, 0, 0]),
            ReplyError::ZeroError,
        ),
        (
            chunk(0, chunk::NONE, 2, &[]),
            ReplyError::ChunkType {
                kind: chunk::NONE,
                flags: 0,
                len: 0,
            },
        ),
        (
            chunk(1, 77, 2, &[]),
            ReplyError::ChunkType {
                kind: 77,
                flags: 1,
                len: 0,
            },
        ),
    ];
    for (bytes, want) in cases {
        let mut p = ReplyParser::new(true);
        let got = p.feed(&bytes, &mut expect, &mut |_| {});
        assert_eq!(got, Err(want), "{bytes:x?}");
    }
    let mut p = ReplyParser::new(false);
    let got = p.feed(&chunk(1, chunk::NONE, 11, &[]), &mut expect, &mut |_| {});
    assert_eq!(got, Err(ReplyError::NotNegotiated));
}
