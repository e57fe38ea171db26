//! The compressed-cluster write cache through the `Format` interface:
//! compressed clusters still in memory read back right, cannot be written
//! over twice, may be discarded, and the closed image is clean and equal
//! to the model for qemu-img, with O_DIRECT and without, with a tiny cache
//! and with none. Through a `Disk` (the engines' read path): reads of
//! clusters still cached are served from memory and write nothing to the
//! file, also for a cluster whose bytes span a host cluster already
//! written; a plain write into a cached cluster afterwards keeps the rest
//! of its data.

mod support;

use std::sync::Arc;

use block::formats::ImageTools;
use block::options::{DiskOptions, ImageType};
use block::Disk;
use support::*;

const CLUSTER: usize = 65536;

/// A compressible cluster that differs per index.
fn cluster(i: usize) -> Vec<u8> {
    let line = format!("cluster {i} of the compressed cache test\n");
    line.bytes().cycle().take(CLUSTER).collect()
}

fn options(p: &std::path::Path, direct: bool) -> DiskOptions {
    let mut o = DiskOptions::new(p);
    o.image_type = ImageType::Format("qcow2");
    o.direct = direct;
    o
}

fn open_direct(p: &std::path::Path, direct: bool) -> Arc<dyn ImageTools> {
    block::formats::open_image_tools(&options(p, direct)).unwrap_or_else(|e| panic!("open: {e:?}"))
}

/// A cluster that compresses to a little over half a cluster: the second
/// of two such clusters spans two host clusters.
fn half_random(i: usize) -> Vec<u8> {
    let mut c = pattern(i as u64 + 1, CLUSTER / 2);
    c.resize(CLUSTER, i as u8);
    c
}

fn disk_read(disk: &Disk, offset: usize, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    disk.read_at(offset as u64, &mut buf)
        .unwrap_or_else(|e| panic!("read {offset:#x}+{len}: {e:?}"));
    buf
}

#[test]
fn reads_of_cached_clusters_come_from_memory_and_write_nothing() {
    for direct in [false, true] {
        for (capacity, make) in [(64, cluster as fn(usize) -> Vec<u8>), (1, half_random)] {
            let what = format!("direct={direct} capacity={capacity}");
            let dir = temp_dir("compressed-cache-read");
            let img = dir.join("c.qcow2");
            qemu_create("qcow2", s(&img), "4M", "cluster_size=65536");
            let f = open_direct(&img, direct);
            f.set_compressed_cache(capacity);
            let mut model = vec![0u8; 4 << 20];
            // Clusters 0..8 compressed, 8 left unallocated, 9 compressed.
            for i in (0..8).chain([9]) {
                let data = make(i);
                assert!(f.write_compressed((i * CLUSTER) as u64, &data).unwrap());
                model[i * CLUSTER..][..CLUSTER].copy_from_slice(&data);
            }
            let disk = Disk::from_format(f.clone(), &options(&img, direct)).unwrap();
            let before = std::fs::read(&img).unwrap();
            for (offset, len) in [
                (9 * CLUSTER, CLUSTER),
                (7 * CLUSTER + 100, 5000),
                (CLUSTER - 512, 4096),
                (6 * CLUSTER, 4 * CLUSTER),
                (0, 10 * CLUSTER),
            ] {
                assert_same(
                    &disk_read(&disk, offset, len),
                    &model[offset..offset + len],
                    &format!("{what}: read {offset:#x}+{len}"),
                );
            }
            // Every one of those reads left the file as it was.
            let after = std::fs::read(&img).unwrap();
            assert!(before == after, "{what}: a read wrote to the file");
            // The clusters still cached are reported as compressed data.
            let st = f.block_status(9 * CLUSTER as u64, CLUSTER as u64).unwrap();
            assert!(st.data && st.compressed, "{what}: {st:?}");

            // A plain write into a cached cluster keeps the rest of it.
            let patch = pattern(99, 5000);
            let at = 3 * CLUSTER + 1000;
            disk.write_at(at as u64, &patch).unwrap();
            model[at..at + patch.len()].copy_from_slice(&patch);
            assert_same(
                &disk_read(&disk, 0, 10 * CLUSTER),
                &model[..10 * CLUSTER],
                &format!("{what}: after a plain write"),
            );
            disk.close().unwrap();
            drop(disk);
            drop(f);
            qemu_check(&img);
            qemu_compare_to_model(&dir, &img, "qcow2", &model);
        }
    }
}

#[test]
fn cached_compressed_clusters_read_back_and_close_clean() {
    for (direct, capacity) in [(false, 2), (true, 2), (true, 64), (false, 0), (true, 0)] {
        let dir = temp_dir("compressed-cache");
        let img = dir.join("c.qcow2");
        qemu_create("qcow2", s(&img), "4M", "cluster_size=65536");
        let f = open_direct(&img, direct);
        f.set_compressed_cache(capacity);
        let mut model = vec![0u8; 4 << 20];
        for i in 0..40 {
            let data = cluster(i);
            assert!(f.write_compressed((i * CLUSTER) as u64, &data).unwrap());
            model[i * CLUSTER..][..CLUSTER].copy_from_slice(&data);
        }
        let what = format!("direct={direct} capacity={capacity}");
        // A cluster written compressed is never written compressed again.
        assert!(f.write_compressed(0, &cluster(0)).is_err(), "{what}");
        assert!(
            f.write_compressed((39 * CLUSTER) as u64, &cluster(39))
                .is_err(),
            "{what}"
        );
        if !direct {
            // The last clusters are still only in memory (capacity 2).
            assert_eq!(
                read(&*f, 39 * CLUSTER as u64, CLUSTER),
                cluster(39),
                "{what}"
            );
            assert_eq!(
                read(&*f, 5 * CLUSTER as u64, 100),
                model[5 * CLUSTER..][..100]
            );
        }
        // Discarding a cluster whose data may still be cached.
        discard(&*f, 38 * CLUSTER as u64, CLUSTER as u64);
        model[38 * CLUSTER..][..CLUSTER].fill(0);
        f.flush_metadata().unwrap();
        for i in 40..44 {
            let data = cluster(i);
            assert!(f.write_compressed((i * CLUSTER) as u64, &data).unwrap());
            model[i * CLUSTER..][..CLUSTER].copy_from_slice(&data);
        }
        f.close().unwrap();
        drop(f);
        qemu_check(&img);
        qemu_compare_to_model(&dir, &img, "qcow2", &model);
    }
}
