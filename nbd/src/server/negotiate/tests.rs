use std::os::unix::net::UnixStream;

use super::*;
use crate::client::{list_exports, negotiate as client_negotiate, ClientConfig};
use crate::wire::consts::flag;

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
