//! The recorded workload: a small qcow2 image made by qemu-img (optionally
//! over a raw backing file, optionally with internal snapshots taken after
//! some data was written), opened by our block layer with the recorders
//! installed, then random allocating writes, overwrites, discards,
//! write-zeroes and flushes on one or more queues of one `Disk`, driven
//! round-robin from one thread (a seed replays the same requests) or by
//! one thread per queue.
//!
//! A [`Config`] and a seed enter; a [`Recording`] leaves: the file's first
//! bytes, the disk's first contents, the log, and the file's final size.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use block::engines::new_engine;
use block::formats::qcow2::metadata::meta_io::MetaIo;
use block::formats::qcow2::open_qcow2;
use block::formats::Format;
use block::{
    BlockRequest, Completion, Disk, DiskOptions, DiskQueue, EngineKind, IoMemory, RequestOp,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::record::{Event, GuestOp, Log, RecordingEngine, RecordingMetaIo};
use super::{
    qemu_create, qemu_create_overlay, qemu_img, qemu_io, s, wait_completions_within, Rng,
    QUEUE_LIMIT,
};

/// One image and workload shape.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub cluster: u64,
    pub lazy_refcounts: bool,
    pub backing: bool,
    pub snapshots: bool,
    pub queues: usize,
    /// Each queue driven by its own thread (else one thread, round-robin).
    pub threads: bool,
    pub engine: EngineKind,
    /// O_DIRECT on the image file (data writes bounce and read-modify-write).
    pub direct: bool,
    /// Guest requests submitted.
    pub requests: usize,
    pub size: u64,
}

impl Config {
    /// The shape of run `seed`: every combination comes round.
    pub fn for_seed(seed: u64, engine: EngineKind) -> Self {
        let bit = |i: u32| (seed >> i) & 1 == 1;
        // Any 8 consecutive seeds from a multiple of 8 cover every
        // cluster size x queue count x backing, half with snapshots and
        // half with lazy refcounts, half with O_DIRECT.
        Config {
            // One run in 8: 512-byte clusters with 64-bit refcounts, so a
            // refcount block covers 32 KiB and the refcount table moves.
            cluster: match (seed % 8, bit(0)) {
                (5, _) => 512,
                (_, true) => 65536,
                _ => 4096,
            },
            queues: if bit(1) { 4 } else { 1 },
            // On unless REPLAY_THREADS=0 (they once found a cluster
            // reused under an in-flight write, docs/qcow2.md).
            threads: threads_enabled() && bit(1) && (bit(0) ^ bit(3)),
            backing: bit(2),
            snapshots: bit(0) ^ bit(1) ^ bit(2) ^ bit(3),
            lazy_refcounts: bit(0) ^ bit(1) ^ bit(4),
            // Not with clusters smaller than a page: our metadata pwrites
            // and O_DIRECT data writes would share pages, which Linux does
            // not keep coherent, so such an open is refused (docs/qcow2.md).
            direct: seed % 8 != 5 && bit(0) ^ bit(2) ^ bit(3),
            engine,
            requests: 160,
            size: 4 << 20,
        }
    }
}

/// Whether half of the 4-queue runs use one thread per queue (unless
/// REPLAY_THREADS=0).
fn threads_enabled() -> bool {
    std::env::var("REPLAY_THREADS").as_deref() != Ok("0")
}

/// What a recorded run leaves for the crash-image builder.
pub struct Recording {
    pub image: PathBuf,
    /// The image file's bytes when the workload started.
    pub start: Vec<u8>,
    /// The virtual disk's contents then (qemu-img convert).
    pub initial: Vec<u8>,
    pub events: Vec<Event>,
    /// The file's size at the end of the workload.
    pub final_len: u64,
}

/// Makes the image of `cfg` in `dir` (qemu-img, qemu-io).
pub fn make_image(dir: &Path, cfg: &Config, seed: u64) -> PathBuf {
    let img = dir.join("image.qcow2");
    let opts = format!(
        "cluster_size={},lazy_refcounts={}{}",
        cfg.cluster,
        if cfg.lazy_refcounts { "on" } else { "off" },
        if cfg.cluster == 512 {
            ",refcount_bits=64"
        } else {
            ""
        }
    );
    let size = cfg.size.to_string();
    if cfg.backing {
        let base = dir.join("base.raw");
        let mut rng = Rng::scrambled(seed ^ 0xba5e);
        let mut bytes = vec![0u8; cfg.size as usize * 3 / 4];
        rng.fill(&mut bytes);
        std::fs::write(&base, bytes).unwrap();
        qemu_create_overlay("qcow2", s(&img), Some(&size), &opts, s(&base), "raw");
    } else {
        qemu_create("qcow2", s(&img), &size, &opts);
    }
    if cfg.snapshots {
        let half = cfg.size / 2;
        qemu_io("qcow2", &img, &[&format!("write -P 0x11 0 {half}")]);
        qemu_img(&["snapshot", "-c", "first", s(&img)]);
        let q = cfg.size / 4;
        qemu_io("qcow2", &img, &[&format!("write -P 0x22 {q} {half}")]);
        qemu_img(&["snapshot", "-c", "second", s(&img)]);
        qemu_io("qcow2", &img, &[&format!("write -P 0x33 {} {q}", q / 2)]);
    }
    img
}

/// The disk's contents through qemu-img (the independent reader).
pub fn virtual_contents(dir: &Path, img: &Path, name: &str) -> Vec<u8> {
    let raw = dir.join(name);
    qemu_img(&["convert", "-U", "-O", "raw", s(img), s(&raw)]);
    let bytes = std::fs::read(&raw).unwrap();
    let _ = std::fs::remove_file(&raw);
    bytes
}

/// One random guest request (sector-aligned, inside the disk).
fn random_request(rng: &mut Rng, cfg: &Config) -> (RequestOp, u64, IoMemory, GuestOp) {
    let sectors = cfg.size / 512;
    // Request sizes scale with the cluster size, but at least with 64 KiB
    // (512-byte clusters: the image must outgrow its refcount table).
    let cs = (cfg.cluster / 512).max(128);
    // Half of the requests hit the first quarter, so overwrites are common.
    let span = if rng.below(2) == 0 {
        sectors / 4
    } else {
        sectors
    };
    let kind = rng.below(100);
    let len = match rng.below(3) {
        0 => 1 + rng.below(16),
        1 => cs * (1 + rng.below(3)),
        _ => 1 + rng.below(3 * cs),
    }
    .min(span);
    let mut start = rng.below(span - len + 1);
    if rng.below(3) == 0 {
        start = start / cs * cs;
    }
    let (offset, bytes) = (start * 512, len * 512);
    if kind < 56 {
        let mut data = vec![0u8; bytes as usize];
        rng.fill(&mut data);
        let data = Arc::new(data);
        let mem = IoMemory::Owned(data.to_vec());
        (
            RequestOp::Write,
            offset,
            mem,
            GuestOp::Write { offset, data },
        )
    } else if kind < 88 {
        let op = if kind < 72 {
            RequestOp::Discard { len: bytes }
        } else {
            RequestOp::WriteZeroes {
                len: bytes,
                may_unmap: rng.below(2) == 0,
            }
        };
        (
            op,
            offset,
            IoMemory::None,
            GuestOp::Zero { offset, len: bytes },
        )
    } else {
        (RequestOp::Flush, 0, IoMemory::None, GuestOp::Flush)
    }
}

fn note_done(log: &Log, out: &mut Vec<Completion>, cfg: &Config, seed: u64) {
    for c in out.drain(..) {
        if let Err(e) = &c.result {
            panic!(
                "seed {seed} {cfg:?}: request at log position {} failed: {e}: {:?}",
                c.user_data,
                std::error::Error::source(e)
            );
        }
        log.push(Event::GuestDone {
            submit: c.user_data as usize,
            ok: true,
        });
    }
}

fn in_flight(queues: &[DiskQueue]) -> usize {
    queues.iter().map(DiskQueue::in_flight).sum()
}

/// Drains every queue until at most `left` requests are in flight,
/// sleeping in poll(2) on their eventfds between rounds. Never blocks on
/// one queue: a queue's commit may wait for another queue's write to be
/// reaped, which only draining that queue does.
fn pump(queues: &mut [DiskQueue], log: &Log, left: usize, cfg: &Config, seed: u64) {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    loop {
        for q in queues.iter_mut() {
            q.drain_completions(&mut out);
        }
        note_done(log, &mut out, cfg, seed);
        if in_flight(queues) <= left {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "seed {seed} {cfg:?}: {} requests stuck in flight",
            in_flight(queues)
        );
        let mut fds: Vec<libc::pollfd> = queues
            .iter()
            .map(|q| libc::pollfd {
                fd: q.completion_eventfd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfds for the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
    }
}

/// `batch` random requests, logged as submitted.
fn random_batch(rng: &mut Rng, batch: usize, log: &Log, cfg: &Config) -> Vec<BlockRequest> {
    (0..batch)
        .map(|_| {
            let (op, offset, memory, guest) = random_request(rng, cfg);
            let at = log.push(Event::GuestSubmit { op: guest });
            BlockRequest {
                user_data: at as u64,
                op,
                offset,
                memory,
            }
        })
        .collect()
}

/// One thread submits to every queue in turn and drains them now and
/// then: the same seed gives the same requests (and, on the sync engine,
/// the same log).
fn drive_round_robin(queues: &mut [DiskQueue], log: &Log, cfg: &Config, seed: u64) {
    let mut rng = Rng::scrambled(seed);
    let mut out = Vec::new();
    let mut submitted = 0;
    while submitted < cfg.requests {
        let q = rng.below(cfg.queues as u64) as usize;
        let batch = (1 + rng.below(3) as usize).min(cfg.requests - submitted);
        let reqs = random_batch(&mut rng, batch, log, cfg);
        submitted += batch;
        queues[q].submit_batch_requests(reqs);
        // Drain some queue now and then; pump when much is in flight.
        let d = rng.below(cfg.queues as u64) as usize;
        if rng.below(2) == 0 {
            queues[d].drain_completions(&mut out);
        }
        note_done(log, &mut out, cfg, seed);
        if in_flight(queues) > 12 {
            pump(queues, log, 6, cfg, seed);
        }
    }
    pump(queues, log, 0, cfg, seed);
}

/// One thread per queue, each with its own requests (seeded from the run's
/// seed and its index) and its own blocking waits: the metadata lock, the
/// discard barriers and parked writes are raced for real, so the log (not
/// the requests) differs from one run of a seed to the next.
fn drive_threads(queues: &mut [DiskQueue], log: &Log, cfg: &Config, seed: u64) {
    let per_queue = cfg.requests / queues.len().max(1);
    std::thread::scope(|scope| {
        for (i, q) in queues.iter_mut().enumerate() {
            scope.spawn(move || {
                let mut rng = Rng::scrambled(seed ^ ((i as u64 + 1) << 40));
                let mut out = Vec::new();
                let mut submitted = 0;
                while submitted < per_queue {
                    let batch = (1 + rng.below(3) as usize).min(per_queue - submitted);
                    q.submit_batch_requests(random_batch(&mut rng, batch, log, cfg));
                    submitted += batch;
                    if q.in_flight() > 4 {
                        wait_completions_within(q, &mut out, QUEUE_LIMIT);
                    } else {
                        q.drain_completions(&mut out);
                    }
                    note_done(log, &mut out, cfg, seed);
                }
                while q.in_flight() > 0 {
                    wait_completions_within(q, &mut out, QUEUE_LIMIT);
                    note_done(log, &mut out, cfg, seed);
                }
            });
        }
    });
}

/// Opens `img` with the recorders installed, runs the workload, and
/// returns what was recorded.
pub fn record(dir: &Path, img: &Path, cfg: &Config, seed: u64) -> Recording {
    let initial = virtual_contents(dir, img, "initial.raw");
    let log = Log::default();
    let mut o = DiskOptions::new(img);
    o.lock = false;
    o.engine = cfg.engine;
    o.direct = cfg.direct;
    let file = block::formats::open::open_file(&o).unwrap();
    let qcow2 = Arc::new(open_qcow2(&o, file, &block::formats::FORMATS).unwrap());
    let l = log.clone();
    qcow2.wrap_meta_io(move |inner| Arc::new(RecordingMetaIo::new(inner, l)) as Arc<dyn MetaIo>);
    let start = std::fs::read(img).unwrap();
    let disk = Disk::from_format(qcow2.clone(), &o).unwrap();
    let mut queues: Vec<DiskQueue> = (0..cfg.queues)
        .map(|_| {
            let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
            let engine = new_engine(cfg.engine, qcow2.files().local(), efd).unwrap();
            disk.queue_on(Box::new(RecordingEngine::new(engine, log.clone())))
        })
        .collect();
    if cfg.threads {
        drive_threads(&mut queues, &log, cfg, seed);
    } else {
        drive_round_robin(&mut queues, &log, cfg, seed);
    }
    let events = log.events();
    let final_len = std::fs::metadata(img).unwrap().len();
    drop(queues);
    drop(disk);
    drop(qcow2);
    Recording {
        image: img.to_path_buf(),
        start,
        initial,
        events,
        final_len,
    }
}
