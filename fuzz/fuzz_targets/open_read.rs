//! Fuzz target: open arbitrary bytes as a qcow2 image and read from it.
//!
//! The input is written to a temporary file, opened read-only as qcow2
//! (no lock), a few ranges are read and their block status queried, and
//! the image's info (snapshot table included) is taken.
//! Any outcome but a panic, a hang or an abort is fine: hostile images
//! must produce errors.

#![no_main]

use std::io::Write;

use block::{Disk, DiskOptions, ImageType};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("block-fuzz-{}.qcow2", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    let mut opts = DiskOptions::new(&path);
    opts.readonly = true;
    opts.lock = false;
    opts.image_type = ImageType::Format("qcow2");
    if let Ok(disk) = Disk::open(&opts) {
        let size = disk.size();
        let mut buf = vec![0u8; 4096];
        for off in [0, size / 2, size.saturating_sub(4096)] {
            let off = off & !511;
            let len = (size - off.min(size)).min(buf.len() as u64) as usize;
            let _ = disk.read_at(off, &mut buf[..len]);
            let _ = disk.format().block_status(off, 1 << 20);
        }
        let _ = disk.format().info();
    }
    let _ = std::fs::remove_file(&path);
});
