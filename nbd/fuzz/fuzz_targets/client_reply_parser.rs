//! Fuzzes what an NBD client reads from a server: the handshake
//! (`nbd::client::negotiate`, when the first byte's top bit is set) or
//! the transmission-phase reply parser, fed in pieces of a size the input
//! chooses, with an expectation table derived from the cookie. Nothing
//! may panic, and every piece of READ data or hole the parser hands out
//! must lie inside the request it answers.

#![no_main]

use std::io::{Read, Write};

use libfuzzer_sys::fuzz_target;
use nbd::client::{negotiate, ClientConfig, Expect, ReplyEvent, ReplyParser};

/// A server whose bytes are the input; what the client says is dropped.
struct Server<'a>(&'a [u8]);

impl Read for Server<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Server<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Cookies 1..=64 are in flight: a third READs (of up to 64 KiB), a
/// third BLOCK_STATUS on context 1, a third anything else.
fn expect(cookie: u64) -> Option<Expect> {
    if !(1..=64).contains(&cookie) {
        return None;
    }
    Some(match cookie % 3 {
        0 => Expect::Read {
            offset: cookie * 4096,
            len: (cookie as u32 * 997) % 65_536,
        },
        1 => Expect::BlockStatus { context: 1 },
        _ => Expect::Other,
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (knobs, input) = data.split_at(2);
    if knobs[0] & 0x80 != 0 {
        let cfg = ClientConfig {
            export: "disk".into(),
            structured: knobs[0] & 1 != 0,
            block_status: knobs[0] & 2 != 0,
        };
        let _ = negotiate(&mut Server(input), &cfg);
        return;
    }
    let mut parser = ReplyParser::new(knobs[0] & 1 != 0);
    let step = usize::from(knobs[1]).max(1);
    let mut check = |ev: ReplyEvent<'_>| match ev {
        ReplyEvent::Data { cookie, at, bytes } => {
            let Some(Expect::Read { len, .. }) = expect(cookie) else {
                panic!("data for a request that is not a read");
            };
            assert!(
                at + bytes.len() as u64 <= u64::from(len),
                "data past the request"
            );
        }
        ReplyEvent::Hole {
            cookie,
            at,
            len: hole,
        } => {
            let Some(Expect::Read { len, .. }) = expect(cookie) else {
                panic!("a hole for a request that is not a read");
            };
            assert!(
                at + u64::from(hole) <= u64::from(len),
                "a hole past the request"
            );
        }
        ReplyEvent::Extents {
            cookie, context, ..
        } => {
            assert_eq!(expect(cookie), Some(Expect::BlockStatus { context }));
        }
        ReplyEvent::Error { errno, .. } => assert!(errno > 0),
        ReplyEvent::Done { cookie } => assert!(expect(cookie).is_some()),
    };
    for piece in input.chunks(step) {
        if parser.feed(piece, &mut expect, &mut check).is_err() {
            break;
        }
    }
});
