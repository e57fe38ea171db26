//! The compressed-cluster write cache through the `Format` interface:
//! compressed clusters still in memory read back right, cannot be written
//! over twice, may be discarded, and the closed image is clean and equal
//! to the model for qemu-img, with O_DIRECT and without, with a tiny cache
//! and with none.

mod support;

use std::sync::Arc;

use block::formats::ImageTools;
use block::options::{DiskOptions, ImageType};
use support::*;

const CLUSTER: usize = 65536;

/// A compressible cluster that differs per index.
fn cluster(i: usize) -> Vec<u8> {
    let line = format!("cluster {i} of the compressed cache test\n");
    line.bytes().cycle().take(CLUSTER).collect()
}

fn open_direct(p: &std::path::Path, direct: bool) -> Arc<dyn ImageTools> {
    let mut o = DiskOptions::new(p);
    o.image_type = ImageType::Qcow2;
    o.direct = direct;
    block::formats::open_image_tools(&o).unwrap_or_else(|e| panic!("open: {e:?}"))
}

#[test]
fn cached_compressed_clusters_read_back_and_close_clean() {
    for (direct, capacity) in [(false, 2), (true, 2), (true, 64), (false, 0), (true, 0)] {
        let dir = TempDir::new("compressed-cache");
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
