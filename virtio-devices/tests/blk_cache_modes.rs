//! QEMU's cache modes as the guest sees them: the CONFIG_WCE byte starts
//! as the mode says (on for none/writeback/unsafe, off for writethrough
//! and directsync), the guest may toggle it except under `unsafe` (whose
//! flushes go nowhere, so writethrough would be a false promise), and a
//! reset restores the mode's default.

mod common;

use block::options::CacheMode;
use block::{Disk, DiskOptions, EngineKind, ImageType};
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_devices::VirtioDevice;
use virtio_host_driver::DriverOptions;

const WCE: u64 = 32;

fn wce(h: &virtio_host_driver::BlockHarness) -> u8 {
    let mut b = [0xffu8; 1];
    h.device.read_config(WCE, &mut b);
    b[0]
}

#[test]
fn the_write_cache_follows_the_cache_mode() {
    for mode in CacheMode::ALL {
        let dir = TempDir::new("cache-mode");
        let raw = raw_image(&dir, 1 << 20);
        let mut o = DiskOptions::new(&raw);
        o.image_type = ImageType::RAW;
        o.engine = EngineKind::Sync;
        o.lock = false;
        o.cache = mode;
        o.direct = mode.direct();
        let mut h = harness(Disk::open(&o).unwrap(), 1, DriverOptions::default());
        assert_eq!(wce(&h), u8::from(mode.writeback()), "{mode}");
        h.device.write_config(WCE, &[u8::from(!mode.writeback())]);
        let toggled = if mode == CacheMode::Unsafe {
            u8::from(mode.writeback())
        } else {
            u8::from(!mode.writeback())
        };
        assert_eq!(wce(&h), toggled, "{mode}: after the guest's toggle");
        // Writes complete either way (writethrough: after the flush).
        let q = h.queue(0).unwrap();
        let data = vec![0x5au8; 4096];
        let s = q.post_data(VIRTIO_BLK_T_OUT, 8, &data).unwrap();
        q.kick().unwrap();
        let u = q.wait_slot(s).unwrap();
        assert_eq!(u.status, VIRTIO_BLK_S_OK as u8, "{mode}");
        let u = q.run(VIRTIO_BLK_T_IN, 8, 4096).unwrap();
        assert_eq!(q.read_data(u.slot, 4096), data, "{mode}");
        let u = q.run(VIRTIO_BLK_T_FLUSH, 0, 0).unwrap();
        assert_eq!(u.status, VIRTIO_BLK_S_OK as u8, "{mode}");
        drop(h.device.reset());
        assert_eq!(wce(&h), u8::from(mode.writeback()), "{mode}: after reset");
        h.device.close().unwrap();
    }
}
