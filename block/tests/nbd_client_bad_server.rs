//! The NBD client against a server inside the test that counts
//! connections or breaks the protocol on purpose: one connection per
//! queue only where multi-conn is advertised; a reply for a cookie never
//! sent, a wrong magic, a read answered short or outside its range, a
//! hang-up in the middle of a reply: each fails the request with EIO
//! (and a protocol violation closes the connection for good), never a
//! panic or a hang. A server that accepts and never speaks is a timeout
//! that says so.

mod nbd_support;
mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use block::{BlockRequest, Disk, DiskOptions, IoMemory, RequestOp};
use nbd_support::{scratch, within, FakeServer, Misbehave};

#[test]
fn queues_get_their_own_connection_only_on_multi_conn_servers() {
    for multi in [false, true] {
        let dir = scratch(&format!("conns-{multi}"));
        let server = FakeServer::start(&dir, 1 << 20, multi, Misbehave::None);
        let uri = server.uri();
        let disk = within(30, move || Disk::open(&DiskOptions::new(uri)).unwrap());
        let queues: Vec<_> = (0..3).map(|_| disk.queue().unwrap()).collect();
        let mut buf = vec![0u8; 4096];
        disk.read_at(4096, &mut buf).unwrap();
        let want: Vec<u8> = (4096..8192).map(|i| (i / 512) as u8).collect();
        assert!(buf == want, "read data differs");
        let want = if multi { 1 + 3 + 1 } else { 1 };
        // The first connection, one per queue made above, and one for
        // the disk's own helper queue (read_at).
        assert_eq!(
            server.connections.load(Ordering::SeqCst),
            want,
            "multi-conn {multi}"
        );
        drop(queues);
    }
}

fn read(disk: &Disk, offset: u64) -> Result<Vec<u8>, block::BlockError> {
    let mut q = disk.queue().unwrap();
    q.submit_batch_requests([BlockRequest {
        user_data: 1,
        op: RequestOp::Read,
        offset,
        memory: IoMemory::Owned(vec![0; 8192]),
    }]);
    let mut out = Vec::new();
    while out.is_empty() {
        support::wait_completions_within(&mut q, &mut out, support::QUEUE_LIMIT);
    }
    let c = out.remove(0);
    c.result.map(|_| c.memory.into_owned().unwrap())
}

#[test]
fn protocol_violations_fail_requests_without_panics_or_hangs() {
    for m in [
        Misbehave::WrongCookie,
        Misbehave::BadMagic,
        Misbehave::ShortRead,
        Misbehave::OutOfRange,
        Misbehave::HangUpMidReply,
    ] {
        let dir = scratch(&format!("bad-{m:?}"));
        let server = FakeServer::start(&dir, 1 << 20, false, m);
        let uri = server.uri();
        within(30, move || {
            // Opening reads the first bytes (format probe): ask for raw.
            let mut o = DiskOptions::new(uri);
            o.image_type = block::ImageType::RAW;
            let disk = Disk::open(&o).unwrap();
            let e = read(&disk, 65_536).unwrap_err();
            assert!(e.to_string().contains("read failed"), "{m:?}: {e}");
            assert_eq!(
                std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<std::io::Error>())
                    .and_then(|s| s.raw_os_error()),
                Some(libc::EIO),
                "{m:?}"
            );
            // The connection is closed for good after a violation (or
            // reconnects and meets the same server again): later
            // requests fail too, they do not hang.
            if m != Misbehave::ShortRead {
                assert!(read(&disk, 0).is_err(), "{m:?}");
            }
            drop(disk);
        });
    }
}

#[test]
fn a_server_that_answers_correctly_is_read_correctly() {
    let dir = scratch("good");
    let server = FakeServer::start(&dir, 1 << 20, false, Misbehave::None);
    let uri = server.uri();
    let data = within(30, move || {
        let disk = Disk::open(&DiskOptions::new(uri)).unwrap();
        disk.write_at(512 * 7, &[0xaa; 1024]).unwrap();
        read(&disk, 0).unwrap()
    });
    let mut want: Vec<u8> = (0..8192).map(|i| (i / 512) as u8).collect();
    want[512 * 7..512 * 9].fill(0xaa);
    assert!(data == want, "read data differs");
    assert!(
        server.data.lock().unwrap()[512 * 7..512 * 9] == [0xaa; 1024],
        "the write did not land"
    );
}

#[test]
fn a_server_that_never_speaks_is_a_clear_timeout() {
    let dir = scratch("silent");
    let sock = dir.join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // Accepts every client and keeps it, saying nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let (e, took) = within(60, move || {
        let t = std::time::Instant::now();
        let e = Disk::open(&DiskOptions::new(&uri)).err();
        (e.map(|e| ch_log::error_chain(&e)), t.elapsed())
    });
    let e = e.expect("a silent server was opened");
    assert!(
        e.contains("timed out after 10 s waiting for the server's greeting"),
        "{e}"
    );
    assert!(!e.contains("temporarily unavailable"), "{e}");
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(30),
        "{took:?}"
    );
}
