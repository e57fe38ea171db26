//! Executor invariants, each with a fault that breaks it if the executor
//! does not handle it: short transfers, EAGAIN, errors on the Nth op,
//! multi-op requests, blocked writes, EOF zero fill, zero and compressed
//! pieces, a 4-entry SQ, and dropping a queue with I/O in flight.

mod engine_support;
mod support;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use block::engines::{new_engine, uring::UringEngine, Engine};
use block::error::BlockError;
use block::{Disk, DiskOptions, DiskQueue, EngineKind};
use engine_support::faults::{faulty_queue, FaultEngine, FaultPlan, FaultStats};
use engine_support::scripted::{Layout, ScriptedFormat};
use engine_support::*;
use support::*;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const ENGINES: [EngineKind; 4] = [
    EngineKind::Sync,
    EngineKind::IoUring,
    EngineKind::Aio,
    EngineKind::Threads,
];

fn open_file(path: &std::path::Path, direct: bool) -> Arc<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    Arc::new(o.open(path).unwrap())
}

fn split_format_with(dir: &TempDir, size: u64, direct: bool, piece: u64) -> Arc<ScriptedFormat> {
    let path = dir.join("img");
    let f = open_file(&path, direct);
    f.set_len(size).unwrap();
    Arc::new(ScriptedFormat::new(vec![f], size, Layout::Split { piece }))
}

fn split_format(dir: &TempDir, size: u64, direct: bool) -> Arc<ScriptedFormat> {
    split_format_with(dir, size, direct, 4096)
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// Expected read-back of the split layout (every third 4 KiB piece zero).
fn split_expected(data: &[u8], offset: u64) -> Vec<u8> {
    split_expected_with(data, offset, 4096)
}

fn split_expected_with(data: &[u8], offset: u64, piece: u64) -> Vec<u8> {
    data.iter()
        .enumerate()
        .map(|(i, b)| {
            if ((offset + i as u64) / piece) % 3 == 2 {
                0
            } else {
                *b
            }
        })
        .collect()
}

#[test]
fn short_transfers_are_resubmitted_until_complete() {
    for kind in ENGINES {
        for direct in [false, true] {
            let dir = temp_dir("short");
            let fmt = split_format_with(&dir, 1 << 20, direct, 32768);
            let plan = FaultPlan {
                short: true,
                short_align: if direct { 4096 } else { 1 },
                ..Default::default()
            };
            let (_disk, mut q, stats) = faulty_queue(fmt.clone(), kind, plan);
            let data = pattern(65536, 1);
            let done = run_batch_polling(
                &mut q,
                vec![write_req(1, 8192, data.clone()), read_req(2, 0, 4096)],
            );
            assert_eq!(done.len(), 2);
            assert_eq!(done[0].result.as_ref().unwrap(), &65536);
            let done = run_batch_polling(&mut q, vec![read_req(3, 8192, 65536)]);
            let back = first_data(done);
            let want = split_expected_with(&data, 8192, 32768);
            let diff = back.iter().zip(&want).position(|(a, b)| a != b);
            assert_eq!(diff, None, "{kind:?} direct={direct}: first difference");
            let s = stats.lock().unwrap().clone();
            // Without resubmission these would come back half-done.
            assert!(s.shortened > 0 && s.pushes > s.shortened, "{s:?}");
            assert_eq!(s.outstanding, 0);
            assert_eq!(fmt.commits.load(Ordering::SeqCst), 1);
        }
    }
}

#[test]
fn eagain_is_retried_not_reported() {
    for kind in ENGINES {
        let dir = temp_dir("eagain");
        let fmt = split_format(&dir, 1 << 20, false);
        let plan = FaultPlan {
            eagain_every: Some(3),
            ..Default::default()
        };
        let (_disk, mut q, stats) = faulty_queue(fmt, kind, plan);
        let reqs = (0..16)
            .map(|i| write_req(i, i * 8192, pattern(8192, i)))
            .collect();
        let done = run_batch_polling(&mut q, reqs);
        assert!(done.iter().all(|c| c.result.is_ok()), "{kind:?}");
        let reqs = (0..16).map(|i| read_req(i, i * 8192, 8192)).collect();
        for (i, c) in run_batch_polling(&mut q, reqs).into_iter().enumerate() {
            let data = c.memory.into_owned().unwrap();
            assert_eq!(
                data,
                split_expected(&pattern(8192, i as u64), i as u64 * 8192)
            );
        }
        let s = stats.lock().unwrap().clone();
        assert!(s.eagains > 0, "{s:?}");
        assert_eq!(s.outstanding, 0);
    }
}

#[test]
fn a_failed_op_fails_its_request_once_and_aborts_the_commit() {
    for kind in ENGINES {
        let dir = temp_dir("fail-nth");
        let fmt = split_format(&dir, 1 << 20, false);
        // Request 0 is one write of 16 ops (pushes 1..=16); fail push 7.
        // Requests 1..=4 are single-op reads (pushes 17..=20); fail 18.
        let plan = FaultPlan {
            fail_pushes: vec![7, 18],
            ..Default::default()
        };
        let (_disk, mut q, stats) = faulty_queue(fmt.clone(), kind, plan);
        let mut reqs = vec![write_req(0, 0, pattern(65536, 9))];
        reqs.extend((1..=4).map(|i| read_req(i, (33 + 3 * i) * 4096, 4096)));
        let done = run_batch(&mut q, reqs);
        assert_eq!(done.len(), 5, "exactly one completion per request");
        assert!(
            matches!(done[0].result, Err(BlockError::Write { offset: 24576, .. })),
            "{:?}",
            done[0].result
        );
        assert!(
            matches!(done[2].result, Err(BlockError::Read { .. })),
            "{:?}",
            done[2].result
        );
        for i in [1, 3, 4] {
            assert!(done[i].result.is_ok(), "request {i}: {:?}", done[i].result);
        }
        assert_eq!(fmt.aborts.load(Ordering::SeqCst), 1);
        assert_eq!(fmt.commits.load(Ordering::SeqCst), 0);
        assert_eq!(stats.lock().unwrap().outstanding, 0);
        assert_eq!(q.in_flight(), 0);
    }
}

#[test]
fn out_of_range_in_a_batch_fails_alone_and_the_rest_run() {
    for kind in ENGINES {
        let dir = temp_dir("oor-batch");
        let fmt = split_format(&dir, 1 << 20, false);
        let (_disk, mut q, stats) = faulty_queue(fmt, kind, FaultPlan::default());
        let reqs = vec![
            write_req(0, 0, pattern(4096, 1)),
            write_req(1, (1 << 20) - 100, pattern(4096, 2)),
            read_req(2, u64::MAX - 10, 100),
            read_req(3, 0, 4096),
        ];
        let done = run_batch(&mut q, reqs);
        assert!(done[0].result.is_ok());
        assert!(matches!(done[1].result, Err(BlockError::OutOfRange { .. })));
        assert!(matches!(done[2].result, Err(BlockError::OutOfRange { .. })));
        assert!(done[3].result.is_ok());
        // The failing requests never reached the engine.
        assert_eq!(stats.lock().unwrap().pushes, 2);
    }
}

#[test]
fn blocked_writes_are_parked_and_replanned_on_wake() {
    for kind in ENGINES {
        let dir = temp_dir("blocked");
        let fmt = split_format(&dir, 1 << 20, false);
        fmt.block_writes.store(2, Ordering::SeqCst);
        let (_disk, mut q, _stats) = faulty_queue(fmt.clone(), kind, FaultPlan::default());
        let data = pattern(4096, 5);
        let done = run_batch(
            &mut q,
            vec![write_req(7, 4096, data.clone()), read_req(8, 0, 512)],
        );
        assert_eq!(done.len(), 2);
        assert!(done[0].result.is_ok());
        assert_eq!(fmt.blocked.load(Ordering::SeqCst), 2);
        assert_eq!(fmt.commits.load(Ordering::SeqCst), 1);
        let back = run_batch(&mut q, vec![read_req(9, 4096, 4096)]);
        assert_eq!(first_data(back), data);
        for h in fmt.wakers.lock().unwrap().drain(..) {
            h.join().unwrap();
        }
    }
}

#[test]
fn reads_past_a_short_backing_file_are_zero() {
    for kind in ENGINES {
        for direct in [false, true] {
            let dir = temp_dir("eof");
            let img = open_file(&dir.join("img"), direct);
            img.set_len(1 << 20).unwrap();
            let backing_path = dir.join("backing");
            std::fs::write(&backing_path, pattern(1000, 3)).unwrap();
            let backing = open_file(&backing_path, direct);
            let fmt = Arc::new(ScriptedFormat::new(
                vec![img, backing],
                1 << 20,
                Layout::Backing,
            ));
            let (_disk, mut q, _stats) = faulty_queue(fmt, kind, FaultPlan::default());
            let done = run_batch(&mut q, vec![read_req(0, 0, 8192), read_req(1, 4096, 4096)]);
            let a = done[0].memory.owned_bytes();
            assert_eq!(
                &a[..1000],
                &pattern(1000, 3)[..],
                "{kind:?} direct={direct}"
            );
            assert!(
                a[1000..].iter().all(|&b| b == 0),
                "{kind:?} direct={direct}"
            );
            assert!(done[1].memory.owned_bytes().iter().all(|&b| b == 0));
            assert_eq!(done[0].result.as_ref().unwrap(), &8192);
        }
    }
}

#[test]
fn compressed_clusters_inflate_once_for_sequential_reads() {
    use std::io::Write;
    for kind in ENGINES {
        for direct in [false, true] {
            let dir = temp_dir("compressed");
            let path = dir.join("img");
            let cluster = 65536u32;
            let c0 = pattern(cluster as usize, 11);
            let c2: Vec<u8> = (0..cluster).map(|i| (i / 100) as u8).collect();
            let mut file_bytes = vec![0u8; 4096];
            let mut table = vec![None; 4];
            for (idx, data) in [(0usize, &c0), (2, &c2)] {
                let mut e =
                    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).unwrap();
                let comp = e.finish().unwrap();
                // Odd host offsets, as qcow2 packs compressed clusters.
                let at = file_bytes.len() as u64 + 3;
                file_bytes.extend_from_slice(&[0, 0, 0]);
                file_bytes.extend_from_slice(&comp);
                table[idx] = Some((at, comp.len() as u64));
            }
            std::fs::write(&path, &file_bytes).unwrap();
            let f = open_file(&path, direct);
            let fmt = Arc::new(ScriptedFormat::new(
                vec![f],
                4 * u64::from(cluster),
                Layout::Compressed {
                    cluster,
                    table,
                    algorithm: block::formats::Compression::Deflate,
                },
            ));
            let (_disk, mut q, stats) = faulty_queue(fmt, kind, FaultPlan::default());
            let mut model = c0.clone();
            model.extend(vec![0u8; cluster as usize]);
            model.extend_from_slice(&c2);
            model.extend(vec![0u8; cluster as usize]);
            // 4 KiB sequential reads over all four clusters, one at a time.
            for i in 0..64u64 {
                let done = run_batch(&mut q, vec![read_req(i, i * 4096, 4096)]);
                let got = done[0].memory.owned_bytes();
                assert_eq!(
                    got,
                    &model[(i * 4096) as usize..][..4096],
                    "{kind:?} direct={direct} read {i}"
                );
            }
            // A read spanning clusters.
            let done = run_batch(&mut q, vec![read_req(100, 60000, 80000)]);
            assert_eq!(done[0].memory.owned_bytes(), &model[60000..140000]);
            // Two compressed clusters, each read from the file once.
            assert_eq!(stats.lock().unwrap().reads, 2, "{kind:?} direct={direct}");
        }
    }
}

#[test]
fn tiny_sq_of_four_entries_does_not_stall() {
    let dir = temp_dir("tiny-sq");
    let fmt = split_format(&dir, 4 << 20, false);
    let o = DiskOptions::new("scripted");
    let disk = Disk::from_format(fmt.clone(), &o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let engine = UringEngine::new(fmt.files.local(), efd, 4).unwrap();
    let (engine, stats) = FaultEngine::new(
        Box::new(engine),
        FaultPlan {
            short: true,
            ..Default::default()
        },
    );
    let mut q = disk.queue_on(Box::new(engine));
    // 64 writes of 4 pieces each: far more ops than SQ (4) or CQ (8) slots.
    let reqs = (0..64)
        .map(|i| write_req(i, i * 16384, pattern(16384, i)))
        .collect();
    let done = run_batch_polling(&mut q, reqs);
    assert!(done.iter().all(|c| c.result.is_ok()));
    let reqs = (0..64).map(|i| read_req(i, i * 16384, 16384)).collect();
    for (i, c) in run_batch_polling(&mut q, reqs).into_iter().enumerate() {
        let want = split_expected(&pattern(16384, i as u64), i as u64 * 16384);
        assert_eq!(c.memory.into_owned().unwrap(), want, "request {i}");
    }
    assert_eq!(stats.lock().unwrap().outstanding, 0);
}

#[test]
fn dropping_a_queue_with_io_in_flight_reaps_every_op() {
    for kind in ENGINES {
        let dir = temp_dir("drop");
        let fmt = split_format(&dir, 4 << 20, true);
        let (_disk, mut q, stats) = faulty_queue(fmt.clone(), kind, FaultPlan::default());
        let mem = guest_memory(8 << 20);
        let reqs: Vec<_> = (0..32u64)
            .map(|i| block::BlockRequest {
                user_data: i,
                op: block::RequestOp::Read,
                offset: i * 65536,
                memory: block::IoMemory::guest(mem.clone(), scattered(i * 131072, 65536, 4096, 0))
                    .unwrap(),
            })
            .collect();
        q.submit_batch_requests(reqs);
        q.submit_batch_requests(vec![write_req(99, 0, pattern(65536, 1))]);
        assert!(q.in_flight() > 0);
        drop(q);
        let s = stats.lock().unwrap().clone();
        assert!(s.pushes > 0);
        assert_eq!(
            s.outstanding, 0,
            "{kind:?}: ops left in the kernel after drop: {s:?}"
        );
        // The commit of the write ran (the format is not left waiting).
        assert_eq!(
            fmt.commits.load(Ordering::SeqCst) + fmt.aborts.load(Ordering::SeqCst),
            1
        );
    }
}

#[test]
fn drain_clears_the_eventfd_and_loses_no_wakeup() {
    let dir = temp_dir("eventfd");
    let fmt = split_format(&dir, 1 << 20, false);
    let (_disk, mut q, _stats) = faulty_queue(fmt, EngineKind::IoUring, FaultPlan::default());
    q.submit_batch_requests(vec![read_req(1, 0, 4096)]);
    let mut out = Vec::new();
    while out.is_empty() {
        // Block on the eventfd the way a worker's epoll would.
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(q.completion_eventfd()),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 5000) };
        assert_eq!(r, 1, "completion eventfd never became readable");
        q.drain_completions(&mut out);
    }
    assert_eq!(out.len(), 1);
    // Drained: the eventfd is no longer readable.
    assert!(q.completion_eventfd().read().is_err());
    let _ = File::open("/dev/null").unwrap().read_at(&mut [0u8; 1], 0);
}

/// A raw disk (`Disk::open`) whose queue runs on a fault engine.
fn raw_faulty(
    dir: &TempDir,
    plan: FaultPlan,
) -> (Disk, DiskQueue, Arc<std::sync::Mutex<FaultStats>>) {
    let path = dir.join("raw.img");
    std::fs::write(&path, vec![0xabu8; 1 << 20]).unwrap();
    let mut o = DiskOptions::new(&path);
    o.image_type = block::ImageType::RAW;
    o.lock = false;
    let disk = Disk::open(&o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let inner = new_engine(EngineKind::Sync, disk.format().files().local(), efd).unwrap();
    let (engine, stats) = FaultEngine::new(inner, plan);
    let q = disk.queue_on(Box::new(engine));
    (disk, q, stats)
}

#[test]
fn zero_range_unsupported_falls_back_to_writing_zeroes() {
    let dir = temp_dir("zero-fallback");
    let plan = FaultPlan {
        fail_pushes: vec![1],
        fail_errno: libc::EOPNOTSUPP,
        ..Default::default()
    };
    let (disk, mut q, stats) = raw_faulty(&dir, plan);
    // Raw + may_unmap=false plans one ZERO_RANGE op (push 1, refused).
    let op = block::RequestOp::WriteZeroes {
        len: 3 << 20 >> 2,
        may_unmap: false,
    };
    let done = run_batch(&mut q, vec![op_req(1, op, 4096)]);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
    assert!(
        stats.lock().unwrap().pushes > 1,
        "the fallback wrote zeroes"
    );
    let mut back = vec![0u8; 1 << 20];
    disk.read_at(0, &mut back).unwrap();
    let zero = 4096..4096 + (3 << 20 >> 2);
    for (i, b) in back.iter().enumerate() {
        assert_eq!(*b, if zero.contains(&i) { 0 } else { 0xab }, "byte {i}");
    }
}

#[test]
fn unsupported_punch_hole_is_ignored_and_flush_errors_are_flush_errors() {
    let dir = temp_dir("punch-flush");
    let plan = FaultPlan {
        fail_pushes: vec![1, 2],
        fail_errno: libc::EOPNOTSUPP,
        ..Default::default()
    };
    let (_disk, mut q, _stats) = raw_faulty(&dir, plan);
    let discard = block::RequestOp::Discard { len: 4096 };
    let done = run_batch(&mut q, vec![op_req(1, discard, 0)]);
    assert!(
        done[0].result.is_ok(),
        "discard is a hint: {:?}",
        done[0].result
    );
    let done = run_batch(&mut q, vec![op_req(2, block::RequestOp::Flush, 0)]);
    assert!(
        matches!(done[0].result, Err(BlockError::Flush(_))),
        "{:?}",
        done[0].result
    );
    // The next flush reaches the disk.
    let done = run_batch(&mut q, vec![op_req(3, block::RequestOp::Flush, 0)]);
    assert!(done[0].result.is_ok());
}

#[test]
fn oversized_unaligned_direct_requests_fail_instead_of_allocating() {
    let dir = temp_dir("bounce-budget");
    let size = 80u64 << 20;
    let fmt = split_format_with(&dir, size, true, size);
    let (_disk, mut q, stats) = faulty_queue(fmt, EngineKind::Sync, FaultPlan::default());
    // Guest memory at an odd address forces bounce buffers; 72 MiB of
    // them is over the per-request budget.
    let mem = guest_memory(80 << 20);
    let odd = |ud, op| block::BlockRequest {
        user_data: ud,
        op,
        offset: 0,
        memory: block::IoMemory::guest(mem.clone(), scattered(1, 72 << 20, 1 << 30, 0)).unwrap(),
    };
    let done = run_batch(
        &mut q,
        vec![
            odd(1, block::RequestOp::Read),
            odd(2, block::RequestOp::Write),
        ],
    );
    assert!(
        matches!(done[0].result, Err(BlockError::Read { .. })),
        "{:?}",
        done[0].result
    );
    assert!(
        matches!(done[1].result, Err(BlockError::Write { .. })),
        "{:?}",
        done[1].result
    );
    assert_eq!(stats.lock().unwrap().pushes, 0);
    // 8 MiB bounced is fine.
    let done = run_batch(&mut q, vec![read_req(3, 4096 + 1, 8 << 20)]);
    assert!(done[0].result.is_ok(), "{:?}", done[0].result);
}

#[test]
fn unaligned_direct_writes_sharing_a_block_both_survive() {
    for kind in ENGINES {
        let dir = temp_dir("rmw");
        let path = dir.join("raw.img");
        std::fs::write(&path, vec![0xabu8; 1 << 20]).unwrap();
        let mut o = DiskOptions::new(&path);
        o.image_type = block::ImageType::RAW;
        o.lock = false;
        o.direct = true;
        o.engine = kind;
        let disk = Disk::open(&o).unwrap();
        assert!(disk.logical_block_size() >= 512);
        let mut q = disk.queue().unwrap();
        let mut model = vec![0xabu8; 1 << 20];
        // Disjoint byte ranges inside the same blocks, in one batch: each
        // write's read-modify-write must see the other's bytes.
        let writes = [
            (10u64, 100usize, 0x11u8),
            (300, 100, 0x22),
            (200, 50, 0x33),
            (4000, 200, 0x44),
            (4300, 10, 0x55),
        ];
        let reqs = writes
            .iter()
            .enumerate()
            .map(|(i, &(off, len, b))| {
                model[off as usize..off as usize + len].fill(b);
                write_req(i as u64, off, vec![b; len])
            })
            .collect();
        let done = run_batch(&mut q, reqs);
        assert!(done.iter().all(|c| c.result.is_ok()));
        let mut back = vec![0u8; 8192];
        disk.read_at(0, &mut back).unwrap();
        let diff = back.iter().zip(&model[..8192]).position(|(a, b)| a != b);
        assert_eq!(diff, None, "{kind:?}: lost update at this byte");
    }
}

#[allow(dead_code)]
fn assert_engine_object_safe(_: &dyn Engine) {}
