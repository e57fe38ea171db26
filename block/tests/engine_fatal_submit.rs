//! A fatal `io_uring_enter` error in the middle of a batch, seen from the
//! executor: the requests whose SQEs already reached the kernel complete
//! normally, every later one fails, and each completes exactly once.
//!
//! The ring has a 4-entry SQ, so a batch of 10 single-op reads enters the
//! kernel several times while it is being built; the fourth enter is made to fail
//! with EIO (`UringEngine::inject_submit_results`).

mod engine_support;
mod support;

use std::sync::Arc;

use block::engines::uring::UringEngine;
use block::error::BlockError;
use block::{Disk, DiskOptions, ImageType};
use engine_support::*;
use support::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const BLOCK: usize = 4096;

fn image(dir: &TempDir, blocks: usize) -> (std::path::PathBuf, Vec<u8>) {
    let path = dir.join("img.raw");
    let mut data = vec![0u8; blocks * BLOCK];
    Rng::new(7).fill(&mut data);
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

fn run(direct: bool) {
    if !testkit::available("io_uring", block::engines::probe::uring_support()) {
        return;
    }
    let dir = temp_dir("fatal-submit");
    let (path, data) = image(&dir, 16);
    let mut o = DiskOptions::new(&path);
    o.image_type = ImageType::RAW;
    o.direct = direct;
    let disk = Disk::open(&o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let mut engine = UringEngine::new(disk.format().files().local(), efd, 4).unwrap();
    // The first enters run, the fourth fails (the engine enters the
    // kernel several times while a batch is built: early submission and
    // a full 4-entry SQ).
    engine.inject_submit_results([0, 0, 0, libc::EIO]);
    let mut q = disk.queue_on(Box::new(engine));

    let reqs = (0..10u64)
        .map(|i| read_req(i, i * BLOCK as u64, BLOCK))
        .collect();
    let done = run_batch_polling(&mut q, reqs);

    assert_eq!(done.len(), 10, "one completion per request");
    // The requests the kernel took before the failing enter succeed, all
    // later ones fail: a prefix of successes, then only errors.
    let ok = done.iter().take_while(|c| c.result.is_ok()).count();
    assert!((3..10).contains(&ok), "{ok} requests succeeded");
    for (i, c) in done.into_iter().enumerate() {
        assert_eq!(c.user_data, i as u64);
        if i < ok {
            assert_eq!(c.result.as_ref().ok(), Some(&(BLOCK as u64)), "request {i}");
            let got = c.memory.into_owned().unwrap();
            assert_eq!(got, data[i * BLOCK..(i + 1) * BLOCK], "request {i} data");
        } else {
            match c.result {
                Err(BlockError::Read { .. }) | Err(BlockError::UringSubmit(_)) => {}
                other => panic!("request {i}: want a read/submit error, got {other:?}"),
            }
        }
    }
    assert_eq!(q.in_flight(), 0);

    // The ring stays broken: a later request fails at once, never hangs.
    let done = run_batch_polling(&mut q, vec![read_req(20, 0, BLOCK)]);
    assert!(done[0].result.is_err());
    drop(q);
    // The image is still usable through a fresh queue.
    let mut buf = vec![0u8; BLOCK];
    disk.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, data[..BLOCK]);
}

#[test]
fn fatal_enter_mid_batch_completes_pushed_requests_and_fails_the_rest() {
    run(false);
}

#[test]
fn fatal_enter_mid_batch_direct() {
    run(true);
}
