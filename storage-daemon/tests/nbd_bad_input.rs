//! Hostile and broken NBD clients against the export: each gets the
//! protocol's error or loses its connection, and neither another client
//! nor the image notices.

mod nbd_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use nbd::wire::consts::{chunk, cmd, error, opt, rep, IHAVEOPT, NBD_MAGIC, STRUCTURED_REPLY_MAGIC};
use nbd::wire::{ChunkHeader, OptionHeader, OptionReplyHeader};
use nbd_support::{have, run, scratch, Daemon, RawClient};

const SIZE: u64 = 4 << 20;

/// A raw image of a known pattern, exported writable or not.
fn setup(name: &str, writable: bool) -> (testkit::TempDir, std::path::PathBuf, Daemon) {
    let dir = scratch(name);
    let img = dir.join("img.raw");
    let data: Vec<u8> = (0..SIZE).map(|i| (i / 4096) as u8).collect();
    std::fs::write(&img, &data).unwrap();
    std::fs::write(dir.join("orig.raw"), &data).unwrap();
    let sock = dir.join("s.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={},image_type=raw", img.display()),
        &format!(
            "addr=unix:{},name=x,writable={}",
            sock.display(),
            if writable { "on" } else { "off" }
        ),
    );
    (dir, sock, d)
}

/// The image still equals its original.
fn unchanged(dir: &std::path::Path) {
    assert_eq!(
        std::fs::read(dir.join("img.raw")).unwrap(),
        std::fs::read(dir.join("orig.raw")).unwrap(),
        "the image changed"
    );
}

fn read_ok(c: &mut RawClient, cookie: u64, offset: u64) {
    c.request(cmd::READ, 0, cookie, offset, 512);
    assert_eq!(c.simple_reply(), (0, cookie));
    assert_eq!(c.read_exact(512), vec![(offset / 4096) as u8; 512]);
}

#[test]
fn bad_commands_get_errors_and_the_connection_goes_on() {
    let (dir, sock, d) = setup("errors", false);
    let mut c = RawClient::connect(&sock, "x", false);
    c.request(42, 0, 1, 0, 0);
    assert_eq!(c.simple_reply(), (error::EINVAL, 1), "unknown command");
    c.request(cmd::READ, 0, 2, SIZE - 256, 512);
    assert_eq!(c.simple_reply(), (error::EINVAL, 2), "read past the end");
    c.request(cmd::WRITE, 0, 3, 0, 4);
    c.send(b"evil");
    assert_eq!(
        c.simple_reply(),
        (error::EPERM, 3),
        "write to a read-only export"
    );
    c.request(cmd::TRIM, 0, 4, 0, 4096);
    assert_eq!(
        c.simple_reply(),
        (error::EPERM, 4),
        "trim of a read-only export"
    );
    c.request(cmd::BLOCK_STATUS, 0, 5, 0, 4096);
    assert_eq!(
        c.simple_reply(),
        (error::EINVAL, 5),
        "block status not negotiated"
    );
    c.request(cmd::READ, 0x80, 6, 0, 512);
    assert_eq!(c.simple_reply(), (error::EINVAL, 6), "unknown flag");
    read_ok(&mut c, 7, 8192);
    // Structured replies carry errors as error chunks with a message.
    let mut s = RawClient::connect(&sock, "x", true);
    s.request(cmd::READ, 0, 8, SIZE, 1);
    let h = ChunkHeader::decode(&s.read_exact(ChunkHeader::SIZE));
    assert_eq!(
        (h.magic, h.kind, h.cookie),
        (STRUCTURED_REPLY_MAGIC, chunk::ERROR, 8)
    );
    let payload = s.read_exact(h.len as usize);
    assert_eq!(
        u32::from_be_bytes(payload[..4].try_into().unwrap()),
        error::EINVAL
    );
    d.stop();
    unchanged(&dir);
}

#[test]
fn writes_past_the_end_are_enospc_and_oversized_ones_end_the_connection() {
    let (dir, sock, d) = setup("oversize", true);
    let mut c = RawClient::connect(&sock, "x", false);
    c.request(cmd::WRITE, 0, 1, SIZE - 2, 4);
    c.send(b"1234");
    assert_eq!(c.simple_reply(), (error::ENOSPC, 1));
    c.request(cmd::WRITE_ZEROES, 0, 2, SIZE, 1);
    assert_eq!(c.simple_reply(), (error::ENOSPC, 2));
    read_ok(&mut c, 3, 0);
    c.request(cmd::WRITE, 0, 4, 0, 64 << 20);
    assert_eq!(c.simple_reply(), (error::EINVAL, 4));
    assert!(
        c.closed(),
        "the connection stays open after an oversized write"
    );
    d.stop();
    unchanged(&dir);
}

#[test]
fn broken_framing_and_hangups_cost_only_their_own_connection() {
    let (dir, sock, d) = setup("framing", true);
    let mut good = RawClient::connect(&sock, "x", true);
    let mut bad = RawClient::connect(&sock, "x", false);
    bad.send(&[0xffu8; 28]);
    assert!(bad.closed(), "bad magic left the connection open");
    // A client that hangs up in the middle of a write's payload.
    let mut half = RawClient::connect(&sock, "x", false);
    half.request(cmd::WRITE, 0, 1, 0, 8192);
    half.send(&[0xee; 1000]);
    drop(half);
    // DISC closes without a reply.
    let mut disc = RawClient::connect(&sock, "x", false);
    disc.request(cmd::DISC, 0, 0, 0, 0);
    assert!(disc.closed());
    // The good client is unaffected.
    good.request(cmd::READ, 0, 9, 4096 * 3, 512);
    let h = ChunkHeader::decode(&good.read_exact(ChunkHeader::SIZE));
    assert_eq!(
        (h.kind, h.flags, h.cookie, h.len),
        (chunk::OFFSET_DATA, chunk::FLAG_DONE, 9, 520)
    );
    let payload = good.read_exact(520);
    assert_eq!(&payload[8..], &[3u8; 512][..]);
    let log = d.stop();
    assert!(log.contains("broke the protocol"), "{log}");
    assert!(log.contains("in the middle of a request"), "{log}");
    unchanged(&dir);
}

/// Reads one option reply: (reply type, data).
fn option_reply(s: &mut UnixStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; OptionReplyHeader::SIZE];
    s.read_exact(&mut h).unwrap();
    let h = OptionReplyHeader::decode(&h);
    let mut data = vec![0u8; h.len as usize];
    s.read_exact(&mut data).unwrap();
    (h.reply, data)
}

fn send_option(s: &mut UnixStream, option: u32, data: &[u8]) {
    let mut b = Vec::new();
    OptionHeader::new(option, data.len() as u32).encode(&mut b);
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
}

#[test]
fn handshake_refuses_what_it_does_not_know_and_closes_on_garbage() {
    let (dir, sock, d) = setup("handshake", false);
    let mut s = UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(
        u64::from_be_bytes(hello[..8].try_into().unwrap()),
        NBD_MAGIC
    );
    assert_eq!(
        u64::from_be_bytes(hello[8..16].try_into().unwrap()),
        IHAVEOPT
    );
    s.write_all(&3u32.to_be_bytes()).unwrap();
    send_option(&mut s, 99, b"whatever");
    assert_eq!(option_reply(&mut s).0, rep::ERR_UNSUP);
    send_option(&mut s, opt::STARTTLS, &[]);
    assert_eq!(option_reply(&mut s).0, rep::ERR_POLICY);
    send_option(&mut s, opt::EXTENDED_HEADERS, &[]);
    assert_eq!(option_reply(&mut s).0, rep::ERR_UNSUP);
    send_option(&mut s, opt::LIST, b"x");
    assert_eq!(option_reply(&mut s).0, rep::ERR_INVALID);
    send_option(
        &mut s,
        opt::SET_META_CONTEXT,
        &[0, 0, 0, 1, b'x', 0, 0, 0, 0],
    );
    assert_eq!(
        option_reply(&mut s).0,
        rep::ERR_INVALID,
        "meta context before structured replies"
    );
    send_option(&mut s, opt::GO, &[0, 0, 0, 9, b'x']);
    assert_eq!(
        option_reply(&mut s).0,
        rep::ERR_INVALID,
        "inconsistent lengths"
    );
    send_option(&mut s, opt::GO, &[0, 0, 0, 1, b'y', 0, 0]);
    assert_eq!(option_reply(&mut s).0, rep::ERR_UNKNOWN);
    // Garbage instead of an option: the server hangs up.
    s.write_all(&[0u8; 16]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty());
    // A client that never finishes its handshake is dropped after the
    // handshake timeout; meanwhile others are served.
    let mut slow = UnixStream::connect(&sock).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    slow.read_exact(&mut hello).unwrap();
    let mut c = RawClient::connect(&sock, "x", false);
    read_ok(&mut c, 1, 4096);
    drop(slow);
    d.stop();
    unchanged(&dir);
}

#[test]
fn the_image_survives_a_client_killed_mid_write() {
    if !have(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = scratch("killed");
    let img = dir.join("k.qcow2");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&img)
        .arg("64M"));
    let sock = dir.join("s.sock");
    let d = Daemon::start(
        &dir,
        &format!("path={}", img.display()),
        &format!("addr=unix:{},writable=on", sock.display()),
    );
    let mut c = RawClient::connect(&sock, "", false);
    // Many writes in flight, then the client vanishes without reading.
    for i in 0..64u64 {
        c.request(cmd::WRITE, 0, i, i * 65536, 65536);
        c.send(&vec![i as u8; 65536]);
    }
    drop(c);
    d.stop();
    let chk = run(Command::new("qemu-img").arg("check").arg(&img));
    assert!(chk.contains("No errors"), "{chk}");
}
