//! `DiskQueue::reap_completions`, on every engine: it hands out every
//! finished request like `drain_completions` but leaves the completion
//! eventfd readable (the caller clears it), and it never blocks.

use std::os::fd::AsRawFd;
use std::path::PathBuf;

use block::{BlockRequest, Completion, Disk, DiskOptions, EngineKind, ImageType, IoMemory};
use block::{DiskQueue, RequestOp};
use support::{temp_dir, TempDir};

mod support;

const ENGINES: [EngineKind; 4] = [
    EngineKind::Sync,
    EngineKind::IoUring,
    EngineKind::Aio,
    EngineKind::Threads,
];

fn open(dir: &TempDir, engine: EngineKind) -> (Disk, PathBuf) {
    let path = dir.path().join("disk.raw");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let mut o = DiskOptions::new(&path);
    o.image_type = ImageType::RAW;
    o.engine = engine;
    o.lock = false;
    (Disk::open(&o).unwrap(), path)
}

/// Whether the queue's eventfd is readable now (poll, no wait).
fn signalled(q: &DiskQueue) -> bool {
    let mut pfd = libc::pollfd {
        fd: q.completion_eventfd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut pfd, 1, 0) };
    assert!(r >= 0, "poll: {}", std::io::Error::last_os_error());
    r == 1
}

/// Waits up to 10 s for the eventfd, then reaps until `n` requests are
/// out; the eventfd is left as the reaping leaves it.
fn reap_n(q: &mut DiskQueue, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while out.len() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {n} completed",
            out.len()
        );
        if signalled(q) {
            q.reap_completions(&mut out);
        } else {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    out
}

fn request(user_data: u64, op: RequestOp, offset: u64, memory: IoMemory) -> BlockRequest {
    BlockRequest {
        user_data,
        op,
        offset,
        memory,
    }
}

#[test]
fn reap_completions_hands_out_requests_and_leaves_the_eventfd_set() {
    for engine in ENGINES {
        if engine == EngineKind::IoUring
            && !testkit::available("io_uring", block::engines::probe::uring_support())
        {
            continue;
        }
        let dir = temp_dir("reap");
        let (disk, _path) = open(&dir, engine);
        let mut q = disk.queue().unwrap();
        // Nothing in flight: nothing out, no wait.
        let mut none = Vec::new();
        q.reap_completions(&mut none);
        assert!(none.is_empty(), "{engine:?}");

        let writes = (0..4u64).map(|i| {
            let data = vec![i as u8 + 1; 4096];
            request(i, RequestOp::Write, i * 8192, IoMemory::Owned(data))
        });
        q.submit_batch_requests(writes);
        let mut done = reap_n(&mut q, 4);
        done.sort_by_key(|c| c.user_data);
        for (i, c) in done.iter().enumerate() {
            assert_eq!(c.user_data, i as u64, "{engine:?}");
            assert_eq!(c.result.as_ref().ok(), Some(&4096), "{engine:?}");
        }
        assert_eq!(q.in_flight(), 0, "{engine:?}");
        // Not cleared by reaping: the caller's own read clears it.
        assert!(signalled(&q), "{engine:?}: reaping cleared the eventfd");
        q.completion_eventfd().read().unwrap();
        assert!(!signalled(&q), "{engine:?}");

        // A completion after the caller cleared it signals it again.
        q.submit_batch_requests([request(
            9,
            RequestOp::Read,
            8192,
            IoMemory::Owned(vec![0; 4096]),
        )]);
        let done = reap_n(&mut q, 1);
        assert_eq!(done[0].user_data, 9, "{engine:?}");
        match &done[0].memory {
            IoMemory::Owned(v) => assert_eq!(v, &vec![2u8; 4096], "{engine:?}"),
            other => panic!("{engine:?}: read memory {other:?}"),
        }
        // The blocking path still works after reaping this way.
        let (n, _) = q
            .run(RequestOp::Read, 0, IoMemory::Owned(vec![0; 512]))
            .unwrap();
        assert_eq!(n, 512, "{engine:?}");
    }
}
