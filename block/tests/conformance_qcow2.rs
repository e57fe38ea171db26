//! Conformance on qcow2: the shared body per engine x {buffered, O_DIRECT}
//! x image kind (plain, overlay on a backing file, deflate- and
//! zstd-compressed, 512 B and 2 MiB clusters, and read-only extended L2),
//! on images qemu-img and qemu-io made. Afterwards
//! `qemu-img check` must be clean and `qemu-img compare` must match the
//! model.

mod engine_support;
mod support;

use block::{Disk, DiskOptions, EngineKind, ImageType};
use engine_support::conformance as body;
use support::*;

const SIZE: usize = 4 << 20;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Plain,
    Backing,
    Deflate,
    Zstd,
    /// 512-byte clusters (many L2 tables, every request multi-cluster).
    Small,
    /// 2 MiB clusters.
    Big,
    /// 2 MiB clusters with extended L2 (subclusters); read only.
    Subclusters,
}

/// Makes the image; returns its path and the model of its contents.
fn make(dir: &TempDir, kind: Kind) -> (std::path::PathBuf, Vec<u8>) {
    let img = dir.join("img.qcow2");
    let mut model = vec![0u8; SIZE];
    match kind {
        Kind::Plain => {
            qemu_create("qcow2", s(&img), &SIZE.to_string(), "cluster_size=65536");
            qemu_io(
                "qcow2",
                &img,
                &[
                    "write -q -P 0x11 0 1M",
                    "write -q -z 2M 64k",
                    "write -q -P 0x12 3M 4k",
                ],
            );
            model[..1 << 20].fill(0x11);
            model[3 << 20..(3 << 20) + 4096].fill(0x12);
        }
        Kind::Backing => {
            let base = dir.join("base.qcow2");
            qemu_create("qcow2", s(&base), &SIZE.to_string(), "cluster_size=4096");
            qemu_io("qcow2", &base, &["write -q -P 0x22 0 2M"]);
            qemu_create_overlay("qcow2", s(&img), None, "", "base.qcow2", "qcow2");
            qemu_io("qcow2", &img, &["write -q -P 0x33 1M 512k"]);
            model[..2 << 20].fill(0x22);
            model[1 << 20..(1 << 20) + (512 << 10)].fill(0x33);
        }
        Kind::Small | Kind::Big | Kind::Subclusters => {
            let opts = match kind {
                Kind::Small => "cluster_size=512",
                Kind::Big => "cluster_size=2M",
                _ => "cluster_size=2M,extended_l2=on",
            };
            qemu_create("qcow2", s(&img), &SIZE.to_string(), opts);
            qemu_io(
                "qcow2",
                &img,
                &["write -q -P 0x44 100k 300k", "write -q -P 0x45 2M 8k"],
            );
            model[100 << 10..400 << 10].fill(0x44);
            model[2 << 20..(2 << 20) + 8192].fill(0x45);
        }
        Kind::Deflate | Kind::Zstd => {
            let raw = dir.join("src.raw");
            let mut rng = Rng::new(77);
            // Compressible data: runs of random bytes.
            for chunk in model[..3 << 20].chunks_mut(64) {
                let b = (rng.next() % 7) as u8;
                chunk.fill(b);
            }
            std::fs::write(&raw, &model).unwrap();
            let ctype = if matches!(kind, Kind::Zstd) {
                "compression_type=zstd"
            } else {
                "compression_type=zlib"
            };
            qemu_convert_compressed(&raw, &img, ctype);
        }
    }
    (img, model)
}

fn case(engine: EngineKind, direct: bool, kind: Kind) {
    let dir = temp_dir(&format!("conf-qcow2-{kind:?}"));
    let (img, model) = make(&dir, kind);
    let mut o = DiskOptions::new(&img);
    o.engine = engine;
    o.direct = direct;
    o.image_type = ImageType::Format("qcow2");
    if matches!(kind, Kind::Small) && direct {
        // 512-byte clusters share pages between metadata (buffered) and
        // data (O_DIRECT): a writable direct open is refused by name
        // (docs/qcow2.md); reads through O_DIRECT still work.
        let err = Disk::open(&o)
            .err()
            .expect("a direct writable open of 512-byte clusters");
        assert!(err.to_string().contains("512-byte clusters"), "{err}");
        // The refused open's locks went with it, even if a child another
        // test thread forked meanwhile still holds its descriptor
        // (tests/image_locks.rs).
        o.readonly = true;
        let disk = Disk::open(&o).unwrap();
        body::exercise_reads(&disk, model, 0x5c);
        return;
    }
    if matches!(kind, Kind::Subclusters) {
        o.readonly = true;
        let disk = Disk::open(&o).unwrap();
        body::exercise_reads(&disk, model, 0x5b ^ u64::from(direct));
        return;
    }
    let disk = Disk::open(&o).unwrap();
    assert_eq!(disk.size(), SIZE as u64);
    let model = body::exercise(&disk, model, 0xc0ffee ^ u64::from(direct) ^ kind as u64);
    disk.close().unwrap();
    drop(disk);
    qemu_img(&["check", "-q", "-f", "qcow2", s(&img)]);
    qemu_compare_to_model(&dir, &img, "qcow2", &model);
}

macro_rules! cases {
    ($($name:ident: $engine:expr, $direct:expr, $kind:expr;)*) => {
        $(
            #[test]
            fn $name() {
                case($engine, $direct, $kind);
            }
        )*
    };
}

cases! {
    qcow2_plain_sync_buffered: EngineKind::Sync, false, Kind::Plain;
    qcow2_plain_sync_direct: EngineKind::Sync, true, Kind::Plain;
    qcow2_plain_uring_buffered: EngineKind::IoUring, false, Kind::Plain;
    qcow2_plain_uring_direct: EngineKind::IoUring, true, Kind::Plain;
    qcow2_backing_sync_buffered: EngineKind::Sync, false, Kind::Backing;
    qcow2_backing_sync_direct: EngineKind::Sync, true, Kind::Backing;
    qcow2_backing_uring_buffered: EngineKind::IoUring, false, Kind::Backing;
    qcow2_backing_uring_direct: EngineKind::IoUring, true, Kind::Backing;
    qcow2_deflate_sync_buffered: EngineKind::Sync, false, Kind::Deflate;
    qcow2_deflate_uring_direct: EngineKind::IoUring, true, Kind::Deflate;
    qcow2_zstd_sync_direct: EngineKind::Sync, true, Kind::Zstd;
    qcow2_zstd_uring_buffered: EngineKind::IoUring, false, Kind::Zstd;
    qcow2_small_clusters_sync_direct: EngineKind::Sync, true, Kind::Small;
    qcow2_small_clusters_uring_buffered: EngineKind::IoUring, false, Kind::Small;
    qcow2_big_clusters_sync_buffered: EngineKind::Sync, false, Kind::Big;
    qcow2_big_clusters_uring_direct: EngineKind::IoUring, true, Kind::Big;
    qcow2_subclusters_read_sync_buffered: EngineKind::Sync, false, Kind::Subclusters;
    qcow2_subclusters_read_uring_direct: EngineKind::IoUring, true, Kind::Subclusters;
    qcow2_plain_aio_buffered: EngineKind::Aio, false, Kind::Plain;
    qcow2_plain_aio_direct: EngineKind::Aio, true, Kind::Plain;
    qcow2_backing_aio_buffered: EngineKind::Aio, false, Kind::Backing;
    qcow2_backing_aio_direct: EngineKind::Aio, true, Kind::Backing;
    qcow2_deflate_aio_buffered: EngineKind::Aio, false, Kind::Deflate;
    qcow2_deflate_aio_direct: EngineKind::Aio, true, Kind::Deflate;
    qcow2_zstd_aio_buffered: EngineKind::Aio, false, Kind::Zstd;
    qcow2_zstd_aio_direct: EngineKind::Aio, true, Kind::Zstd;
    qcow2_small_clusters_aio_buffered: EngineKind::Aio, false, Kind::Small;
    qcow2_small_clusters_aio_direct: EngineKind::Aio, true, Kind::Small;
    qcow2_big_clusters_aio_buffered: EngineKind::Aio, false, Kind::Big;
    qcow2_big_clusters_aio_direct: EngineKind::Aio, true, Kind::Big;
    qcow2_subclusters_read_aio_buffered: EngineKind::Aio, false, Kind::Subclusters;
    qcow2_subclusters_read_aio_direct: EngineKind::Aio, true, Kind::Subclusters;
    qcow2_plain_threads_buffered: EngineKind::Threads, false, Kind::Plain;
    qcow2_plain_threads_direct: EngineKind::Threads, true, Kind::Plain;
    qcow2_backing_threads_buffered: EngineKind::Threads, false, Kind::Backing;
    qcow2_backing_threads_direct: EngineKind::Threads, true, Kind::Backing;
    qcow2_deflate_threads_buffered: EngineKind::Threads, false, Kind::Deflate;
    qcow2_deflate_threads_direct: EngineKind::Threads, true, Kind::Deflate;
    qcow2_zstd_threads_buffered: EngineKind::Threads, false, Kind::Zstd;
    qcow2_zstd_threads_direct: EngineKind::Threads, true, Kind::Zstd;
    qcow2_small_clusters_threads_buffered: EngineKind::Threads, false, Kind::Small;
    qcow2_small_clusters_threads_direct: EngineKind::Threads, true, Kind::Small;
    qcow2_big_clusters_threads_buffered: EngineKind::Threads, false, Kind::Big;
    qcow2_big_clusters_threads_direct: EngineKind::Threads, true, Kind::Big;
    qcow2_subclusters_read_threads_buffered: EngineKind::Threads, false, Kind::Subclusters;
    qcow2_subclusters_read_threads_direct: EngineKind::Threads, true, Kind::Subclusters;
}

/// The body on an overlay with a backing file, through a fault engine
/// over a real engine that halves every transfer and answers EAGAIN to every
/// seventh op: real qcow2 plans (copy-on-write parts, several ops per
/// request) must still come out right.
fn faulty_case(engine: EngineKind, direct: bool) {
    use block::engines::new_engine;
    use engine_support::faults::{FaultEngine, FaultPlan};
    use std::sync::Arc;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    let dir = temp_dir("conf-qcow2-faults");
    let (img, model) = make(&dir, Kind::Backing);
    let mut o = DiskOptions::new(&img);
    o.engine = engine;
    o.direct = direct;
    o.image_type = ImageType::Format("qcow2");
    let disk = Disk::open(&o).unwrap();
    let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let inner = new_engine(engine, disk.format().files().local(), efd).unwrap();
    let plan = FaultPlan {
        short: true,
        short_align: if direct { 4096 } else { 1 },
        eagain_every: Some(7),
        ..Default::default()
    };
    let (engine, stats) = FaultEngine::new(inner, plan);
    let q = disk.queue_on(Box::new(engine));
    let model = body::exercise_on(&disk, q, model, 0xfa17 ^ u64::from(direct));
    let st = stats.lock().unwrap().clone();
    assert!(st.shortened > 0 && st.eagains > 0, "{st:?}");
    assert_eq!(st.outstanding, 0);
    disk.close().unwrap();
    drop(disk);
    qemu_img(&["check", "-q", "-f", "qcow2", s(&img)]);
    qemu_compare_to_model(&dir, &img, "qcow2", &model);
}

#[test]
fn qcow2_backing_uring_with_faults_buffered() {
    faulty_case(EngineKind::IoUring, false);
}

#[test]
fn qcow2_backing_uring_with_faults_direct() {
    faulty_case(EngineKind::IoUring, true);
}

#[test]
fn qcow2_backing_aio_with_faults_direct() {
    faulty_case(EngineKind::Aio, true);
}

#[test]
fn qcow2_backing_threads_with_faults_buffered() {
    faulty_case(EngineKind::Threads, false);
}
