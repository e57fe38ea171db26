//! Shared helpers of the device tests: scratch image files and a harness
//! over a real disk.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use block::{Disk, DiskOptions, EngineKind, ImageType};
use virtio_devices::block::BlockDeviceConfig;
use virtio_devices::testing::{BlockHarness, DriverOptions};

/// A scratch folder removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let p = std::env::temp_dir().join(format!("vblk-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A raw image of `size` bytes whose sector N is filled with byte N % 251.
pub fn raw_image(dir: &TempDir, size: u64) -> PathBuf {
    let path = dir.path("disk.raw");
    let mut data = vec![0u8; size as usize];
    for (i, chunk) in data.chunks_mut(512).enumerate() {
        chunk.fill((i % 251) as u8);
    }
    std::fs::write(&path, &data).unwrap();
    path
}

/// A qcow2 copy of a raw image made by qemu-img (None if it is missing).
pub fn qcow2_from_raw(dir: &TempDir, raw: &Path) -> Option<PathBuf> {
    let path = dir.path("disk.qcow2");
    let ok = Command::new("qemu-img")
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
        .arg(&path)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then_some(path)
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
