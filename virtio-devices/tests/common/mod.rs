//! Shared helpers of the device tests: scratch image files and a harness
//! over a real disk.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use block::{Disk, DiskOptions, EngineKind, ImageType};
use virtio_devices::block::BlockDeviceConfig;
use virtio_host_driver::{BlockHarness, DriverOptions, QueueDriver};

pub use testkit::TempDir;

/// A raw image of `size` bytes whose sector N is filled with byte N % 251.
pub fn raw_image(dir: &TempDir, size: u64) -> PathBuf {
    let path = dir.join("disk.raw");
    let mut data = vec![0u8; size as usize];
    for (i, chunk) in data.chunks_mut(512).enumerate() {
        chunk.fill((i % 251) as u8);
    }
    std::fs::write(&path, &data).unwrap();
    path
}

/// A qcow2 copy of a raw image made by qemu-img; `None` (the test skips)
/// only when qemu-img is missing and `CH_REQUIRE_ALL` is not set. A
/// failing conversion fails the test.
pub fn qcow2_from_raw(dir: &TempDir, raw: &Path) -> Option<PathBuf> {
    if !testkit::has_command("qemu-img") {
        return None;
    }
    let path = dir.join("disk.qcow2");
    let out = testkit::output_within(
        Command::new("qemu-img")
            .args([
                "convert",
                "-f",
                "raw",
                "-O",
                "qcow2",
                "-o",
                "cluster_size=65536",
            ])
            .arg(raw)
            .arg(&path),
        testkit::COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "qemu-img convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(path)
}

/// A raw image opened on `engine` with one queue made to prove the engine
/// works; `None` (the test skips) only when the engine is io_uring and the
/// kernel has none, and `CH_REQUIRE_ALL` is not set. Our own open errors
/// fail the test.
pub fn open_engine(path: &Path, engine: EngineKind) -> Option<Disk> {
    if engine == EngineKind::IoUring
        && !testkit::available("io_uring", block::engines::probe::uring_support())
    {
        return None;
    }
    let mut o = DiskOptions::new(path);
    o.image_type = ImageType::RAW;
    o.engine = engine;
    o.lock = false;
    let disk = Disk::open(&o).unwrap();
    drop(disk.queue().unwrap());
    Some(disk)
}

pub fn open(path: &Path, image_type: ImageType, readonly: bool) -> Result<Disk, block::BlockError> {
    open_with(path, image_type, readonly, false)
}

/// Opens with the sync engine, buffered or O_DIRECT.
pub fn open_with(
    path: &Path,
    image_type: ImageType,
    readonly: bool,
    direct: bool,
) -> Result<Disk, block::BlockError> {
    let mut o = DiskOptions::new(path);
    o.direct = direct;
    o.readonly = readonly;
    o.image_type = image_type;
    o.engine = EngineKind::Sync;
    o.lock = false;
    Disk::open(&o)
}

pub fn harness(disk: Disk, num_queues: u16, opts: DriverOptions) -> BlockHarness {
    let config = BlockDeviceConfig {
        num_queues,
        queue_size: 64,
        serial: b"vblk-test-serial".to_vec(),
        ..Default::default()
    };
    BlockHarness::new(disk, config, opts).unwrap()
}

/// Expected content of sector `s` of [`raw_image`].
pub fn sector_byte(s: u64) -> u8 {
    (s % 251) as u8
}

/// Reads `total` requests of `sectors` sectors through `q` (a
/// [`raw_image`] disk), keeping as many in flight as the driver has slots
/// and posting new ones as others complete; sector `n * 37 % span` for
/// the n-th. Checks every returned request's status, used length and
/// data. `what` names the run in failure messages.
pub fn reads_in_flight(q: &mut QueueDriver, total: u64, sectors: u32, span: u64, what: &str) {
    use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN};
    let bytes = sectors * 512;
    let mut sector_of = std::collections::HashMap::new();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut used = Vec::new();
    while done < total {
        while posted < total {
            let sector = (posted * 37) % span;
            let Some(slot) = q.post(VIRTIO_BLK_T_IN, sector, bytes) else {
                break;
            };
            sector_of.insert(slot, sector);
            posted += 1;
        }
        q.kick().unwrap();
        used.clear();
        let n = q.wait(Duration::from_secs(10), &mut used).unwrap();
        assert!(n > 0, "{what}: no completion after {done} of {total}");
        for u in &used {
            assert_eq!(u32::from(u.status), VIRTIO_BLK_S_OK, "{what}");
            assert_eq!(u.used_len, bytes + 1, "{what}");
            let first = sector_of[&u.slot];
            for (i, s) in q.read_data(u.slot, bytes as usize).chunks(512).enumerate() {
                let want = sector_byte(first + i as u64);
                assert!(
                    s.iter().all(|&b| b == want),
                    "{what}: wrong data at sector {first}+{i}"
                );
            }
        }
        done += used.len() as u64;
    }
}
