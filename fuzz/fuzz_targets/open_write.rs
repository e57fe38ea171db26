//! Fuzz target: open arbitrary bytes as a read-write qcow2 image and
//! change it.
//!
//! The input is written to a temporary file and opened read-write as
//! qcow2 (no lock). The last bytes of the input also steer a short
//! script: writes (allocating, copy-on-write of compressed or backing
//! clusters, partial clusters), write-zeroes, discards, a compressed
//! write, snapshot create/apply/delete, a grow or a shrink and flushes, then the
//! image is closed and checked (and repaired) by `check_image`.
//! Any outcome but a panic, a hang or an abort is fine: a hostile image
//! must give errors, whatever is asked of it.

#![no_main]

use std::io::Write;

use block::check::{check_image, Repair};
use block::{DiskOptions, ExclusiveImage, ImageType};
use libfuzzer_sys::fuzz_target;

/// Script bytes, taken from the end of the input: the image is the whole
/// input, so qemu-made seeds stay valid images, and the end (data or
/// padding) varies more than the header's first bytes.
const SCRIPT: usize = 12;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("block-fuzz-w-{}.qcow2", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    let script: Vec<u8> = data.iter().rev().take(SCRIPT).copied().collect();
    let mut opts = DiskOptions::new(&path);
    opts.lock = false;
    opts.image_type = ImageType::Format("qcow2");
    if let Ok(image) = ExclusiveImage::open(&opts) {
        let disk = image.disk();
        let tools = image.tools();
        let size = disk.size();
        let buf = vec![0x5au8; 70_000];
        for (i, &b) in script.iter().enumerate() {
            // Offsets spread over the disk, 512-aligned; lengths up to
            // just over a 64 KiB cluster.
            let off = if size == 0 {
                0
            } else {
                (size / 251 * u64::from(b)) & !511
            };
            let len = (u64::from(b) * 277 % 70_000 + 1).min(size.saturating_sub(off));
            let _ = match (b as usize + i) % 11 {
                0..=3 => disk.write_at(off, &buf[..(len as usize & !511).clamp(512, buf.len())]),
                4 => disk.write_zeroes(off, len & !511, b & 1 == 0),
                5 => disk.discard(off, len & !511),
                6 => tools
                    .write_compressed(off & !0xffff, &buf[..65536])
                    .map(|_| ()),
                7 => tools.snapshot_create(&format!("s{}", b % 3), (0, 0)),
                8 => tools.snapshot_apply(&format!("s{}", b % 3)).map(|_| ()),
                9 => tools.snapshot_delete(&format!("s{}", b % 3)).map(|_| ()),
                _ => disk.flush(),
            };
        }
        match script.first().map(|b| b % 5) {
            Some(0) => {
                let _ = image.resizer().resize(size.saturating_add(1 << 20));
            }
            // A shrink to a sector inside the disk (snapshots may share
            // the tables and the last cluster it cuts).
            Some(1) => {
                let _ = image.resizer().resize(size / 3 / 512 * 512);
            }
            _ => {}
        }
        let _ = image.close();
        let _ = check_image(&path, Some(Repair::All));
    }
    let _ = std::fs::remove_file(&path);
});
