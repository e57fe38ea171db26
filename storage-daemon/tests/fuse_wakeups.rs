//! How a FUSE queue thread learns that image I/O completed: it never
//! reads its disk queue's completion eventfd with a syscall (the /dev/fuse
//! thread watches it edge-triggered, the ring thread has a READ of it in
//! its own ring), so `strace` attached to the daemon sees no 8-byte
//! `read` while O_DIRECT reads go through the export (in io_uring mode no
//! `read` at all). The same trace must show the /dev/fuse reads or the
//! ring enters of the requests, which proves it was attached.
//! Needs root and strace; skips without them unless CH_REQUIRE_ALL=1.

mod support;

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{assert_ring_served, cannot_run, scratch, Daemon, Transport};

/// The `read`s strace logged, as (returned bytes) per call.
fn read_results(trace: &str) -> Vec<i64> {
    trace
        .lines()
        .filter(|l| l.contains("read(") && !l.contains("unfinished"))
        .filter_map(|l| l.rsplit("= ").next()?.split(' ').next()?.parse().ok())
        .collect()
}

fn no_eventfd_reads(transport: Transport) {
    if cannot_run(&["strace"]) {
        return;
    }
    let Some(_switch) = transport.prepare() else {
        return;
    };
    let dir = scratch(&format!("wakeups-{transport:?}"));
    let image = dir.join("disk.raw");
    std::fs::write(&image, vec![0x5au8; 1 << 20]).unwrap();
    let d = Daemon::start(
        &dir,
        &format!("path={},image_type=raw,direct=on", image.display()),
        &format!("{}num_queues=1", transport.options()),
    )
    .unwrap();
    let trace = dir.join("strace.txt");
    let mut strace = Command::new("strace")
        .args(["-f", "-e", "trace=read,io_uring_enter", "-o"])
        .arg(&trace)
        .args(["-p", &d.pid().to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // strace writes nothing until it has attached to every thread.
    std::thread::sleep(Duration::from_millis(500));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&d.mountpoint)
        .unwrap();
    let mut buf = block::aligned::AlignedBuf::new(4096, 4096).unwrap();
    for i in 0..300u64 {
        let n = file
            .read_at(buf.as_mut_slice(), (i * 7 % 256) * 4096)
            .unwrap();
        assert_eq!(n, 4096);
        assert!(buf.as_slice().iter().all(|&b| b == 0x5a), "read {i} wrong");
    }
    // SAFETY: signalling a child we started and have not waited for.
    unsafe { libc::kill(strace.id() as i32, libc::SIGINT) };
    strace.wait().unwrap();
    let log = d.stop();
    let text = std::fs::read_to_string(&trace).unwrap();
    let reads = read_results(&text);
    let eventfd_reads = reads.iter().filter(|&&n| n == 8).count();
    assert_eq!(eventfd_reads, 0, "8-byte reads (the eventfd):\n{text}");
    match transport {
        // Each request is one read of /dev/fuse (80 bytes of headers).
        Transport::DevFuse => assert!(
            reads.iter().filter(|&&n| n > 8).count() >= 300,
            "strace saw too few /dev/fuse reads: {reads:?}"
        ),
        Transport::IoUring => {
            // Nothing reads at all: requests come through the ring, and
            // a read of the eventfd, even one finding it empty, is a
            // syscall the ring's READ saves.
            let any_read = text.lines().filter(|l| l.contains("read(")).count();
            assert_eq!(any_read, 0, "reads in io_uring mode:\n{text}");
            assert_ring_served(&log);
            let enters = text
                .lines()
                .filter(|l| l.contains("io_uring_enter("))
                .count();
            assert!(enters >= 300, "strace saw {enters} io_uring_enters");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_need_no_eventfd_read_devfuse() {
    no_eventfd_reads(Transport::DevFuse);
}

#[test]
fn completions_need_no_eventfd_read_io_uring() {
    no_eventfd_reads(Transport::IoUring);
}
