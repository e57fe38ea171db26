//! `BlockDeviceConfig::queue_affinity`: a pinned queue's worker thread
//! runs on the CPUs given and nowhere else; an unpinned queue's worker
//! keeps the process's CPUs. Read back from /proc (Cpus_allowed_list of
//! each `virtio-blk-qN` thread) while the device is active, after I/O
//! went through both queues.

mod common;

use std::time::Duration;

use block::ImageType;
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::block::BlockDeviceConfig;
use virtio_host_driver::{BlockHarness, DriverOptions};

/// The Cpus_allowed_list of this process's thread named `name`.
fn cpus_of_thread(name: &str) -> Option<String> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
        if comm.trim() == name {
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            return status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string());
        }
    }
    None
}

#[test]
fn pinned_queue_runs_on_its_cpus_only() {
    let dir = TempDir::new("affinity");
    let raw = raw_image(&dir, 1 << 20);
    let disk = open(&raw, ImageType::RAW, false).unwrap();
    let process = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string();
    // The highest CPU this process may use (a single one on a 1-CPU box).
    let cpu: usize = process.rsplit([',', '-']).next().unwrap().parse().unwrap();
    let config = BlockDeviceConfig {
        num_queues: 2,
        queue_size: 64,
        queue_affinity: vec![Some(vec![cpu]), None],
        ..Default::default()
    };
    let mut h = BlockHarness::new(disk, config, DriverOptions::default()).unwrap();
    for q in 0..2 {
        let used = h
            .queue(q)
            .unwrap()
            .run(VIRTIO_BLK_T_IN, 0, 512)
            .expect("a read through the queue");
        assert_eq!(u32::from(used.status), VIRTIO_BLK_S_OK);
    }
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(
        cpus_of_thread("virtio-blk-q0").as_deref(),
        Some(cpu.to_string().as_str())
    );
    assert_eq!(
        cpus_of_thread("virtio-blk-q1").as_deref(),
        Some(process.as_str())
    );
}
