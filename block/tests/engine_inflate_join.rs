//! Compressed clusters read by several requests in flight together: the
//! cluster is read from the file and inflated once, every request gets
//! its piece, and a failed read of the cluster fails every request that
//! waited for it (exactly once each). Clusters the queue inflates itself
//! (zstd) come back a few per drain, each drain waking the next.

mod engine_support;
mod support;

use std::io::Write;
use std::sync::Arc;

use block::formats::Compression;
use block::{Disk, DiskQueue, EngineKind};
use engine_support::faults::{faulty_queue, FaultPlan, FaultStats};
use engine_support::scripted::{Layout, ScriptedFormat};
use engine_support::*;
use support::*;

const CLUSTER: u32 = 65536;

type Stats = Arc<std::sync::Mutex<FaultStats>>;

/// Two compressed clusters (0 and 1); returns the queue and their data.
fn setup(dir: &TempDir, kind: EngineKind, plan: FaultPlan) -> (Disk, DiskQueue, Stats, Vec<u8>) {
    setup_clusters(dir, kind, plan, 2, Compression::Deflate)
}

/// `clusters` compressed clusters with `algorithm`, half random, half zero.
fn setup_clusters(
    dir: &TempDir,
    kind: EngineKind,
    plan: FaultPlan,
    clusters: u64,
    algorithm: Compression,
) -> (Disk, DiskQueue, Stats, Vec<u8>) {
    let path = dir.join("img");
    let mut model = Vec::new();
    let mut file_bytes = vec![0u8; 4096];
    let mut table = Vec::new();
    for c in 0..clusters {
        let mut data = vec![0u8; CLUSTER as usize];
        Rng::new(c + 5).fill(&mut data[..CLUSTER as usize / 2]);
        let comp = match algorithm {
            Compression::Deflate => {
                let mut e =
                    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(&data).unwrap();
                e.finish().unwrap()
            }
            Compression::Zstd => zstd::bulk::compress(&data, 1).unwrap(),
        };
        table.push(Some((file_bytes.len() as u64, comp.len() as u64)));
        file_bytes.extend_from_slice(&comp);
        model.extend_from_slice(&data);
    }
    std::fs::write(&path, &file_bytes).unwrap();
    let f = Arc::new(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap(),
    );
    let fmt = Arc::new(ScriptedFormat::new(
        vec![f],
        clusters * u64::from(CLUSTER),
        Layout::Compressed {
            cluster: CLUSTER,
            table,
            algorithm,
        },
    ));
    let (disk, q, stats) = faulty_queue(fmt, kind, plan);
    (disk, q, stats, model)
}

#[test]
fn reads_of_one_cluster_in_one_batch_read_it_once() {
    for kind in [
        EngineKind::Sync,
        EngineKind::IoUring,
        EngineKind::Aio,
        EngineKind::Threads,
    ] {
        if kind == EngineKind::IoUring
            && !testkit::available("io_uring", block::io::probe::uring_support())
        {
            continue;
        }
        let dir = temp_dir("inflate-join");
        let (_disk, mut q, stats, model) = setup(&dir, kind, FaultPlan::default());
        // 32 reads of 4 KiB over both clusters, all in flight together.
        let reqs = (0..32u64).map(|i| read_req(i, i * 4096, 4096)).collect();
        let done = run_batch_polling(&mut q, reqs);
        for (i, c) in done.iter().enumerate() {
            let got = match &c.memory {
                block::IoMemory::Owned(v) => v.clone(),
                _ => panic!("not owned"),
            };
            assert!(c.result.is_ok(), "{kind:?} read {i}: {:?}", c.result);
            assert_eq!(got, model[i * 4096..][..4096], "{kind:?} read {i}");
        }
        assert_eq!(
            stats.lock().unwrap().reads,
            2,
            "{kind:?}: each cluster read once"
        );
        // Later reads hit the cache.
        let done = run_batch_polling(&mut q, vec![read_req(99, 8192, 4096)]);
        assert!(done[0].result.is_ok());
        assert_eq!(stats.lock().unwrap().reads, 2);
    }
}

#[test]
fn a_failed_cluster_read_fails_every_waiting_read_once() {
    for kind in [
        EngineKind::Sync,
        EngineKind::IoUring,
        EngineKind::Aio,
        EngineKind::Threads,
    ] {
        if kind == EngineKind::IoUring
            && !testkit::available("io_uring", block::io::probe::uring_support())
        {
            continue;
        }
        let dir = temp_dir("inflate-join-fail");
        // The first push (cluster 0's read) fails with EIO.
        let plan = FaultPlan {
            fail_pushes: vec![1],
            ..Default::default()
        };
        let (_disk, mut q, stats, model) = setup(&dir, kind, plan);
        let reqs = (0..32u64).map(|i| read_req(i, i * 4096, 4096)).collect();
        let done = run_batch_polling(&mut q, reqs);
        assert_eq!(done.len(), 32);
        for (i, c) in done.iter().enumerate() {
            if i < 16 {
                assert!(c.result.is_err(), "{kind:?} read {i} of the failed cluster");
            } else {
                assert!(c.result.is_ok(), "{kind:?} read {i}: {:?}", c.result);
                if let block::IoMemory::Owned(v) = &c.memory {
                    assert_eq!(v[..], model[i * 4096..][..4096]);
                }
            }
        }
        assert_eq!(stats.lock().unwrap().outstanding, 0);
        // The cluster is not stuck: a new read fetches it.
        let done = run_batch_polling(&mut q, vec![read_req(50, 4096, 4096)]);
        assert!(done[0].result.is_ok(), "{kind:?}: {:?}", done[0].result);
    }
}

/// Sixteen zstd clusters whose reads all completed before the first drain:
/// the queue inflates a few per drain and wakes its eventfd for the rest,
/// so a caller that sleeps on the eventfd between drains gets every one
/// (without the wake-up it would sleep forever after the first drain).
#[test]
fn queue_inflated_clusters_come_back_a_few_per_drain() {
    for kind in [
        EngineKind::Sync,
        EngineKind::IoUring,
        EngineKind::Aio,
        EngineKind::Threads,
    ] {
        if kind == EngineKind::IoUring
            && !testkit::available("io_uring", block::io::probe::uring_support())
        {
            continue;
        }
        let dir = temp_dir("inflate-backlog");
        let (_disk, mut q, stats, model) =
            setup_clusters(&dir, kind, FaultPlan::default(), 16, Compression::Zstd);
        let reqs: Vec<_> = (0..16u64)
            .map(|i| read_req(i, i * u64::from(CLUSTER) + 8192, 4096))
            .collect();
        // Cached reads complete inside the submit (sync engine: inline;
        // io_uring: in io_uring_enter), so every read is usually ready at
        // the first drain; if some are not, there are only more drains.
        q.submit_batch_requests(reqs);
        let mut out = Vec::new();
        let mut drains = 0;
        while out.len() < 16 {
            assert!(
                completion_signalled(&q, 5_000),
                "{kind:?}: no wake-up after {} of 16 completions",
                out.len()
            );
            q.drain_completions(&mut out);
            drains += 1;
        }
        assert_eq!(out.len(), 16);
        assert!(
            drains >= 16 / block::io::INFLATIONS_PER_DRAIN,
            "{kind:?}: {drains} drains inflated 16 clusters"
        );
        out.sort_by_key(|c| c.user_data);
        for (i, c) in out.iter().enumerate() {
            assert!(c.result.is_ok(), "{kind:?} read {i}: {:?}", c.result);
            let block::IoMemory::Owned(v) = &c.memory else {
                panic!("not owned")
            };
            let at = i * CLUSTER as usize + 8192;
            assert_eq!(v[..], model[at..at + 4096], "{kind:?} read {i}");
        }
        assert_eq!(stats.lock().unwrap().reads, 16);
        assert_eq!(q.in_flight(), 0);
    }
}
