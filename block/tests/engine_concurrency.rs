//! Four queues on four threads doing random reads, writes, write-zeroes,
//! discards and flushes on one qcow2 overlay with a backing file, or on a
//! qcow2 image whose every cluster starts zstd-compressed (the same data,
//! no backing file: first writes copy compressed clusters, discards free
//! host clusters that other compressed clusters share, and reads inflate
//! in the queue while other queues write).
//!
//! The model stays well defined under concurrency:
//! - zone A (interleaved): 4 KiB block `b` belongs to thread `b % 4`, so
//!   threads allocate and copy-on-write the same clusters at once;
//! - zone B (exclusive): whole clusters per thread, with cluster discards;
//! - zone C (shared): any thread writes whole 4 KiB blocks in one of
//!   [`VERSIONS`] patterns per block, at any time. A read racing a write of
//!   the same block may legally see a mix (Linux does not make a buffered
//!   `pread` atomic against a `pwrite` of the same page: two plain C
//!   threads tear about 2 % of such reads on this machine), so a read must
//!   hold, byte for byte, backing data or a pattern of that block; stale
//!   data from elsewhere, zeroes or garbage fail. At the end, with no
//!   writes left, every block must be intact: backing data or one pattern.
//!
//! Afterwards `qemu-img check` is clean, zones A and B equal the model,
//! zone C blocks are intact, and qemu-img reads what we read.

mod engine_support;
mod support;

use block::{BlockRequest, Disk, DiskOptions, EngineKind, ImageType, IoMemory, RequestOp};
use engine_support::*;
use support::*;

const CLUSTER: u64 = 65536;
const BLOCK: u64 = 4096;
const THREADS: u64 = 4;
const ZONE_A: (u64, u64) = (0, 1 << 20);
const ZONE_B: (u64, u64) = (1 << 20, 5 << 20);
const ZONE_C: (u64, u64) = (5 << 20, 6 << 20);
const SIZE: u64 = 8 << 20;
/// Batches per thread; `ENGINE_CONCURRENCY_BATCHES` overrides it for long
/// runs.
fn batches() -> u32 {
    std::env::var("ENGINE_CONCURRENCY_BATCHES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150)
}

fn backing_byte(off: u64) -> u8 {
    ((off / 512) as u8) ^ 0x5a
}

/// Patterns a zone C block can be written with.
const VERSIONS: u64 = 16;

/// Byte `i` of pattern `w` of zone C block `block` (a mix of the three).
fn pattern_byte(block: u64, i: u64, w: u64) -> u8 {
    let mut x = block.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i << 8)
        ^ w.wrapping_mul(0xd6e8_feb8_6659_fd93);
    x ^= x >> 29;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 32;
    x as u8
}

/// The data thread `tid` writes to zone C block `block` as its `seq`th
/// zone C write.
fn stamped(tid: u64, seq: u64, block: u64) -> Vec<u8> {
    let w = (tid * 4 + seq % 4) % VERSIONS;
    (0..BLOCK).map(|i| pattern_byte(block, i, w)).collect()
}

/// Whether a zone C block is intact: backing data or one whole pattern.
fn intact(data: &[u8], off: u64) -> bool {
    let block = off / BLOCK;
    let is_backing = data
        .iter()
        .enumerate()
        .all(|(i, &b)| b == backing_byte(off + i as u64));
    is_backing
        || (0..VERSIONS).any(|w| {
            data.iter()
                .enumerate()
                .all(|(i, &b)| b == pattern_byte(block, i as u64, w))
        })
}

/// Whether every byte of a zone C read is backing data or a byte some
/// write of this block could have put there.
fn each_byte_written_or_backing(data: &[u8], off: u64) -> bool {
    let block = off / BLOCK;
    data.iter().enumerate().all(|(i, &b)| {
        b == backing_byte(off + i as u64)
            || (0..VERSIONS).any(|w| b == pattern_byte(block, i as u64, w))
    })
}

/// What each 512-byte sector of a zone C block holds, for failure
/// messages: `b` backing data, a hex digit for one whole pattern, `m` a
/// mix of patterns and backing, `?` anything else.
fn describe(data: &[u8], off: u64) -> String {
    let block = off / BLOCK;
    data.chunks(512)
        .enumerate()
        .map(|(n, sector)| {
            let at = (n * 512) as u64;
            let byte_ok = |i: usize, w: u64| sector[i] == pattern_byte(block, at + i as u64, w);
            if (0..sector.len()).all(|i| sector[i] == backing_byte(off + at + i as u64)) {
                'b'
            } else if let Some(w) =
                (0..VERSIONS).find(|&w| (0..sector.len()).all(|i| byte_ok(i, w)))
            {
                char::from_digit(w as u32, 16).unwrap_or('v')
            } else if each_byte_written_or_backing(sector, off + at) {
                'm'
            } else {
                '?'
            }
        })
        .collect()
}

fn worker(disk: Disk, tid: u64, mut model: Vec<u8>) -> Vec<u8> {
    let mut q = disk.queue().unwrap();
    let mut rng = Rng::new(0x1234 + tid);
    let my_b = (
        ZONE_B.0 + tid * (ZONE_B.1 - ZONE_B.0) / THREADS,
        (ZONE_B.1 - ZONE_B.0) / THREADS,
    );
    let mut seq = 0u64;
    for _ in 0..batches() {
        let mut reqs = Vec::new();
        let mut reads: Vec<(u64, u64, u8)> = Vec::new(); // (ud, off, zone)
        let mut updates: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut used: Vec<(u64, u64)> = Vec::new();
        for ud in 0..(1 + rng.below(8)) {
            let (off, len, zone) = match rng.below(3) {
                0 => {
                    let blocks = (ZONE_A.1 - ZONE_A.0) / BLOCK / THREADS;
                    (
                        ZONE_A.0 + (rng.below(blocks) * THREADS + tid) * BLOCK,
                        BLOCK,
                        b'A',
                    )
                }
                1 => {
                    let off = my_b.0 + rng.below(my_b.1 / 512) * 512;
                    let len = (1 + rng.below(64)) * 512;
                    (off, len.min(my_b.0 + my_b.1 - off), b'B')
                }
                _ => (
                    ZONE_C.0 + rng.below((ZONE_C.1 - ZONE_C.0) / BLOCK) * BLOCK,
                    BLOCK,
                    b'C',
                ),
            };
            // Ops of one batch do not overlap (their order is undefined).
            if used.iter().any(|&(o, l)| off < o + l && o < off + len) {
                continue;
            }
            used.push((off, len));
            let kind = rng.below(10);
            let req = match (zone, kind) {
                (_, 0..=3) => {
                    reads.push((ud, off, zone));
                    read_req(ud, off, len as usize)
                }
                (b'C', _) => {
                    seq += 1;
                    write_req(ud, off, stamped(tid, seq, off / BLOCK))
                }
                (_, 4..=6) => {
                    let mut data = vec![0u8; len as usize];
                    rng.fill(&mut data);
                    updates.push((off, data.clone()));
                    write_req(ud, off, data)
                }
                (_, 7) => {
                    updates.push((off, vec![0; len as usize]));
                    op_req(
                        ud,
                        RequestOp::WriteZeroes {
                            len,
                            may_unmap: rng.below(2) == 0,
                        },
                        off,
                    )
                }
                (b'B', 8) => {
                    let c = off / CLUSTER * CLUSTER;
                    if used[..used.len() - 1]
                        .iter()
                        .any(|&(o, l)| c < o + l && o < c + CLUSTER)
                    {
                        used.pop();
                        continue;
                    }
                    *used.last_mut().unwrap() = (c, CLUSTER);
                    updates.push((c, vec![0; CLUSTER as usize]));
                    op_req(ud, RequestOp::Discard { len: CLUSTER }, c)
                }
                _ => op_req(ud, RequestOp::Flush, 0),
            };
            reqs.push(req);
        }
        let by_ud: std::collections::HashMap<u64, usize> = reqs
            .iter()
            .enumerate()
            .map(|(i, r): (usize, &BlockRequest)| (r.user_data, i))
            .collect();
        let n = reqs.len();
        q.submit_batch_requests(reqs);
        let mut out = Vec::new();
        while out.len() < n {
            support::wait_completions_within(&mut q, &mut out, support::QUEUE_LIMIT);
        }
        assert_eq!(out.len(), n);
        assert!(by_ud.len() == n);
        for c in &out {
            if let Err(e) = &c.result {
                panic!("thread {tid}: request failed: {e:?}");
            }
        }
        for (ud, off, zone) in reads {
            let c = out.iter().find(|c| c.user_data == ud).unwrap();
            let IoMemory::Owned(data) = &c.memory else {
                panic!()
            };
            if zone == b'C' {
                assert!(
                    each_byte_written_or_backing(data, off),
                    "thread {tid}: zone C read at {off} holds data no write put there: {}",
                    describe(data, off)
                );
            } else {
                let want = &model[off as usize..off as usize + data.len()];
                let diff = data.iter().zip(want).position(|(a, b)| a != b);
                assert_eq!(
                    diff, None,
                    "thread {tid}: zone {} read at {off}",
                    zone as char
                );
            }
        }
        for (off, data) in updates {
            model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        }
    }
    model
}

/// Where the initial data (`backing_byte`) comes from.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    /// A raw backing file under an empty overlay.
    RawBacking,
    /// The image's own clusters, every one zstd-compressed.
    ZstdClusters,
}

fn run(engine: EngineKind, direct: bool, start: Start) {
    let dir = temp_dir("concurrency");
    let base = dir.join("base.raw");
    let img = dir.join("img.qcow2");
    let backing: Vec<u8> = (0..SIZE).map(backing_byte).collect();
    std::fs::write(&base, &backing).unwrap();
    match start {
        Start::RawBacking => qemu_create_overlay(
            "qcow2",
            s(&img),
            None,
            "cluster_size=65536",
            "base.raw",
            "raw",
        ),
        Start::ZstdClusters => {
            qemu_convert_compressed(&base, &img, "cluster_size=65536,compression_type=zstd");
            let check = qemu_img(&["check", "--output=json", s(&img)]);
            assert!(
                check.contains(&format!("\"compressed-clusters\": {}", SIZE / CLUSTER)),
                "not every cluster is compressed: {check}"
            );
        }
    }
    let mut o = DiskOptions::new(&img);
    o.engine = engine;
    o.direct = direct;
    o.image_type = ImageType::Format("qcow2");
    let disk = Disk::open(&o).unwrap();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let d = disk.clone();
            let m = backing.clone();
            std::thread::spawn(move || worker(d, t, m))
        })
        .collect();
    let models: Vec<Vec<u8>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    disk.close().unwrap();
    drop(disk);
    qemu_img(&["check", "-q", "-f", "qcow2", s(&img)]);

    // What qemu reads equals what we read, and both match the model.
    let ours = {
        let disk = Disk::open(&o).unwrap();
        let mut all = vec![0u8; SIZE as usize];
        disk.read_at(0, &mut all).unwrap();
        all
    };
    let theirs_path = dir.join("theirs.raw");
    qemu_img(&[
        "convert",
        "-q",
        "-f",
        "qcow2",
        "-O",
        "raw",
        s(&img),
        s(&theirs_path),
    ]);
    let theirs = std::fs::read(&theirs_path).unwrap();
    assert!(ours == theirs, "qemu-img reads different data than we do");
    for off in (ZONE_A.0..ZONE_A.1).step_by(BLOCK as usize) {
        let t = ((off - ZONE_A.0) / BLOCK % THREADS) as usize;
        let r = off as usize..(off + BLOCK) as usize;
        assert!(
            ours[r.clone()] == models[t][r],
            "zone A block at {off} (thread {t})"
        );
    }
    for (t, model) in models.iter().enumerate() {
        let len = (ZONE_B.1 - ZONE_B.0) / THREADS;
        let start = (ZONE_B.0 + t as u64 * len) as usize;
        let r = start..start + len as usize;
        assert!(ours[r.clone()] == model[r], "zone B of thread {t}");
    }
    for off in (ZONE_C.0..ZONE_C.1).step_by(BLOCK as usize) {
        assert!(
            intact(&ours[off as usize..(off + BLOCK) as usize], off),
            "zone C block at {off}: {}",
            describe(&ours[off as usize..(off + BLOCK) as usize], off)
        );
    }
    // Beyond the zones: untouched backing data.
    assert!(ours[ZONE_C.1 as usize..] == backing[ZONE_C.1 as usize..]);
}

#[test]
fn four_queues_sync_engine() {
    run(EngineKind::Sync, false, Start::RawBacking);
}

#[test]
fn four_queues_uring_engine() {
    run(EngineKind::IoUring, false, Start::RawBacking);
}

#[test]
fn four_queues_uring_engine_direct() {
    run(EngineKind::IoUring, true, Start::RawBacking);
}

#[test]
fn four_queues_sync_engine_over_zstd_clusters() {
    run(EngineKind::Sync, false, Start::ZstdClusters);
}

#[test]
fn four_queues_uring_engine_direct_over_zstd_clusters() {
    run(EngineKind::IoUring, true, Start::ZstdClusters);
}

#[test]
fn four_queues_threads_engine() {
    run(EngineKind::Threads, false, Start::RawBacking);
}

#[test]
fn four_queues_aio_engine_direct() {
    run(EngineKind::Aio, true, Start::RawBacking);
}

#[test]
fn four_queues_aio_engine_direct_over_zstd_clusters() {
    run(EngineKind::Aio, true, Start::ZstdClusters);
}
