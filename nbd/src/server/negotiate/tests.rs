use std::os::unix::net::UnixStream;

use super::*;
use crate::client::{list_exports, negotiate as client_negotiate, ClientConfig};
use crate::server::MetaContext;
use crate::wire::consts::{flag, handshake};

fn export() -> ExportDesc {
    ExportDesc {
        name: "disk".into(),
        description: Some("a test disk".into()),
        size: 1 << 30,
        flags: flag::HAS_FLAGS | flag::SEND_FLUSH,
        block_sizes: [1, 4096, 32 << 20],
    }
}

/// Runs the server's handshake in a thread against `client`.
fn with_server<T>(
    client: impl FnOnce(&mut UnixStream) -> T,
) -> (T, Result<Negotiated, HandshakeError>) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || negotiate(&mut b, &export()));
    let r = client(&mut a);
    drop(a);
    (r, server.join().unwrap())
}

#[test]
fn our_client_negotiates_structured_replies_and_block_status() {
    let cfg = ClientConfig {
        export: "disk".into(),
        structured: true,
        block_status: true,
    };
    let (info, server) = with_server(|s| client_negotiate(s, &cfg).unwrap());
    assert_eq!(info.size, 1 << 30);
    assert!(info.structured);
    assert_eq!(info.base_allocation, Some(0));
    assert!(info.has(flag::SEND_DF) && info.has(flag::SEND_FLUSH));
    assert_eq!(info.block_sizes, Some([1, 4096, 32 << 20]));
    let Negotiated::Go(session) = server.unwrap() else {
        panic!("no GO")
    };
    assert!(session.structured && session.base_allocation);
}

#[test]
fn unknown_exports_are_refused_and_lists_name_ours() {
    let cfg = ClientConfig {
        export: "nope".into(),
        ..Default::default()
    };
    let (err, server) = with_server(|s| client_negotiate(s, &cfg).unwrap_err().to_string());
    assert!(err.contains("no export named 'nope'"), "{err}");
    // The client said goodbye (NBD_OPT_ABORT) rather than vanishing.
    assert!(matches!(server, Ok(Negotiated::Aborted)), "{server:?}");
    let (list, server) = with_server(|s| list_exports(s).unwrap());
    assert_eq!(list, [("disk".to_string(), "a test disk".to_string())]);
    assert!(matches!(server.unwrap(), Negotiated::Aborted));
}

#[test]
fn broken_framing_ends_the_handshake() {
    let (_, server) = with_server(|s| {
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&1u32.to_be_bytes()).unwrap();
        s.write_all(&[0xff; 16]).unwrap();
    });
    assert!(matches!(server, Err(HandshakeError::Magic(_))));
    let (_, server) = with_server(|s| {
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&0x80u32.to_be_bytes()).unwrap();
    });
    assert!(matches!(server, Err(HandshakeError::ClientFlags(0x80))));
    let (_, server) = with_server(|s| {
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&1u32.to_be_bytes()).unwrap();
        let mut b = Vec::new();
        OptionHeader::new(opt::GO, u32::MAX).encode(&mut b);
        s.write_all(&b).unwrap();
    });
    assert!(matches!(server, Err(HandshakeError::OptionTooLong { .. })));
}

#[test]
fn a_silent_server_times_out_naming_the_step() {
    let (mut a, b) = UnixStream::pair().unwrap();
    a.set_read_timeout(Some(std::time::Duration::from_millis(50)))
        .unwrap();
    let err = client_negotiate(&mut a, &ClientConfig::default()).unwrap_err();
    assert!(
        matches!(&err, crate::client::NegotiateError::TimedOut(step) if step == "waiting for the server's greeting"),
        "{err:?}"
    );
    // A server that hangs up instead is named as such.
    drop(b);
    let err = client_negotiate(&mut a, &ClientConfig::default()).unwrap_err();
    assert!(err.to_string().contains("closed the connection"), "{err}");
}

/// A client speaking options by hand: the greeting, then `option` with
/// its data, returning every reply (type, data) up to the ACK or error.
struct RawOptions<'s>(&'s mut UnixStream);

impl RawOptions<'_> {
    fn greet(s: &mut UnixStream) -> RawOptions<'_> {
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        let flags = u32::from(handshake::FIXED_NEWSTYLE | handshake::NO_ZEROES);
        s.write_all(&flags.to_be_bytes()).unwrap();
        RawOptions(s)
    }

    fn send(&mut self, option: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut b = Vec::new();
        OptionHeader::new(option, data.len() as u32).encode(&mut b);
        b.extend_from_slice(data);
        self.0.write_all(&b).unwrap();
        let mut replies = Vec::new();
        loop {
            let mut h = [0u8; OptionReplyHeader::SIZE];
            self.0.read_exact(&mut h).unwrap();
            let h = OptionReplyHeader::decode(&h);
            let mut d = vec![0u8; h.len as usize];
            self.0.read_exact(&mut d).unwrap();
            replies.push((h.reply, d));
            if h.reply != rep::META_CONTEXT && h.reply != rep::INFO {
                return replies;
            }
        }
    }

    /// LIST or SET with `queries`; returns (id, name) per context, or the
    /// error reply type.
    fn meta(
        &mut self,
        option: u32,
        export: &str,
        queries: &[&str],
    ) -> Result<Vec<(u32, String)>, u32> {
        let mut d = Vec::new();
        put_string(&mut d, export.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            put_string(&mut d, q.as_bytes());
        }
        let replies = self.send(option, &d);
        let (last, _) = replies.last().unwrap();
        if *last != rep::ACK {
            return Err(*last);
        }
        Ok(replies[..replies.len() - 1]
            .iter()
            .map(|(t, d)| {
                assert_eq!(*t, rep::META_CONTEXT);
                (be32(d, 0), String::from_utf8(d[4..].to_vec()).unwrap())
            })
            .collect())
    }

    fn go(&mut self) {
        let mut d = Vec::new();
        put_string(&mut d, b"disk");
        d.extend_from_slice(&0u16.to_be_bytes());
        let replies = self.send(opt::GO, &d);
        assert_eq!(replies.last().unwrap().0, rep::ACK);
    }
}

/// The server's handshake offering bitmaps `b0` and `b1`, against `client`.
fn with_bitmap_server<T>(
    client: impl FnOnce(&mut RawOptions<'_>) -> T,
) -> (T, Result<Negotiated, HandshakeError>) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || {
        let bitmaps = ["b0".to_string(), "b1".to_string()];
        negotiate_offering_bitmaps(&mut b, &export(), &bitmaps)
    });
    let r = client(&mut RawOptions::greet(&mut a));
    drop(a);
    (r, server.join().unwrap())
}

fn owned(list: &[(u32, &str)]) -> Vec<(u32, String)> {
    list.iter().map(|(i, n)| (*i, n.to_string())).collect()
}

#[test]
fn meta_contexts_list_and_select_as_qemu_does() {
    let (_, server) = with_bitmap_server(|c| {
        let every = owned(&[
            (0, "base:allocation"),
            (0, "qemu:dirty-bitmap:b0"),
            (0, "qemu:dirty-bitmap:b1"),
        ]);
        // LIST: every context without queries, ids 0.
        assert_eq!(
            c.meta(opt::LIST_META_CONTEXT, "disk", &[]),
            Ok(every.clone())
        );
        assert_eq!(
            c.meta(opt::LIST_META_CONTEXT, "disk", &["qemu:"]),
            Ok(every[1..].to_vec())
        );
        assert_eq!(
            c.meta(
                opt::LIST_META_CONTEXT,
                "disk",
                &["base:", "qemu:dirty-bitmap:"]
            ),
            Ok(every.clone())
        );
        assert_eq!(
            c.meta(opt::LIST_META_CONTEXT, "nope", &[]),
            Err(rep::ERR_UNKNOWN)
        );
        // SET needs structured replies.
        assert_eq!(
            c.meta(opt::SET_META_CONTEXT, "disk", &["base:allocation"]),
            Err(rep::ERR_INVALID)
        );
        assert_eq!(c.send(opt::STRUCTURED_REPLY, &[])[0].0, rep::ACK);
        // Wildcards select nothing in SET; unknown leaves are ignored.
        assert_eq!(
            c.meta(
                opt::SET_META_CONTEXT,
                "disk",
                &[
                    "qemu:",
                    "base:",
                    "qemu:dirty-bitmap:",
                    "qemu:dirty-bitmap:b9",
                    "x-a:b"
                ]
            ),
            Ok(vec![])
        );
        assert_eq!(
            c.meta(
                opt::SET_META_CONTEXT,
                "disk",
                &[
                    "qemu:dirty-bitmap:b1",
                    "qemu:allocation-depth",
                    "base:allocation"
                ]
            ),
            Ok(owned(&[
                (0, "base:allocation"),
                (3, "qemu:dirty-bitmap:b1")
            ]))
        );
        c.go();
    });
    let Negotiated::Go(session) = server.unwrap() else {
        panic!("no GO")
    };
    assert_eq!(
        session.contexts(),
        [MetaContext::BaseAllocation, MetaContext::DirtyBitmap(1)]
    );
    assert!(session.block_status());
}

#[test]
fn a_failed_set_leaves_nothing_selected() {
    let (_, server) = with_bitmap_server(|c| {
        assert_eq!(c.send(opt::STRUCTURED_REPLY, &[])[0].0, rep::ACK);
        assert_eq!(
            c.meta(opt::SET_META_CONTEXT, "disk", &["qemu:dirty-bitmap:b0"]),
            Ok(owned(&[(2, "qemu:dirty-bitmap:b0")]))
        );
        // A LIST leaves the selection alone...
        assert!(c.meta(opt::LIST_META_CONTEXT, "disk", &[]).is_ok());
        // ... a SET for another export replaces it with nothing.
        assert_eq!(
            c.meta(opt::SET_META_CONTEXT, "other", &["base:allocation"]),
            Err(rep::ERR_UNKNOWN)
        );
        c.go();
    });
    let Negotiated::Go(session) = server.unwrap() else {
        panic!("no GO")
    };
    assert!(session.contexts().is_empty() && !session.block_status());
}

#[test]
fn without_bitmaps_only_base_allocation_is_offered() {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || negotiate(&mut b, &export()));
    let mut c = RawOptions::greet(&mut a);
    assert_eq!(
        c.meta(opt::LIST_META_CONTEXT, "disk", &[]),
        Ok(owned(&[(0, "base:allocation")]))
    );
    assert_eq!(
        c.meta(opt::LIST_META_CONTEXT, "disk", &["qemu:dirty-bitmap:"]),
        Ok(vec![])
    );
    c.go();
    drop(a);
    assert!(matches!(server.join().unwrap(), Ok(Negotiated::Go(_))));
}
