//! Corrupted images: random bytes flipped in the metadata of a qemu-made
//! image must give errors, never a panic, a hang or a huge allocation.
//! Each corrupted copy runs under a deadline (`with_deadline`).

mod support;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use block::options::DiskOptions;
use support::*;

/// Longer than any case takes on a loaded machine (a few milliseconds
/// each), short enough that a hang fails the test instead of stalling it.
const CASE_LIMIT: Duration = Duration::from_secs(30);

/// Opens one corrupted copy and reads, maps, writes and discards through
/// it, ignoring the errors; returns whether it opened.
fn exercise(p: &Path, readonly: bool, write_at: u64) -> bool {
    let mut o = DiskOptions::new(p);
    o.readonly = readonly;
    o.lock = false;
    let Ok(img) = block::formats::open_format(&o) else {
        return false;
    };
    let size = img.size().min(8 << 20);
    let mut plan = Vec::new();
    let _ = img.plan_read(0, size, &mut plan);
    let _ = img.block_status(0, size);
    if !readonly {
        let w = waker();
        if let Ok(block::formats::WriteOutcome::Ready(p)) = img.plan_write(write_at, 4096, &w) {
            execute(&*img, &p, &[0u8; 4096]);
            if let Some(c) = p.commit {
                let _ = img.commit(c);
            }
        }
        if let Ok(block::formats::WriteOutcome::Ready(p)) = img.plan_discard(0, 65536, &w) {
            execute(&*img, &p, &[]);
            if let Some(c) = p.commit {
                let _ = img.commit(c);
            }
        }
        let _ = img.flush_metadata();
    }
    true
}

fn fuzz_one(d: &TempDir, name: &str, create_opts: &str, writes: &[&str], meta_end: u64, seed: u64) {
    let good = d.join(format!("{name}.qcow2"));
    qemu_create("qcow2", good.to_str().unwrap(), "4M", create_opts);
    let mut args = Vec::new();
    for w in writes {
        args.extend(["-c", *w]);
    }
    args.push(good.to_str().unwrap());
    run("qemu-io", &args);
    let bytes = std::fs::read(&good).unwrap();
    let mut rng = seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut opened, mut failed) = (0, 0);
    for i in 0..150 {
        let p = d.join(format!("{name}-{i}.qcow2"));
        std::fs::write(&p, &bytes).unwrap();
        let f = std::fs::File::options().write(true).open(&p).unwrap();
        for _ in 0..(1 + next() % 4) {
            let off = next() % meta_end.min(bytes.len() as u64);
            f.write_all_at(&[next() as u8], off).unwrap();
        }
        let readonly = i % 2 == 0;
        let write_at = 4096 * (next() % 1024);
        let case = p.clone();
        let was_opened = with_deadline(&format!("{name} case {i}"), CASE_LIMIT, move || {
            exercise(&case, readonly, write_at)
        });
        if was_opened {
            opened += 1;
        } else {
            failed += 1;
        }
        let _ = std::fs::remove_file(&p);
    }
    assert!(
        opened > 0,
        "{name}: every corrupted copy was refused ({failed})"
    );
}

#[test]
fn flipped_metadata_bytes_never_panic() {
    let d = temp_dir("corrupt");
    fuzz_one(
        &d,
        "plain",
        "cluster_size=4096",
        &["write -P 0x12 0 200k", "write -c -P 0x34 1M 64k"],
        6 * 4096,
        0x1234_5678,
    );
    fuzz_one(
        &d,
        "extl2",
        "cluster_size=65536,extended_l2=on",
        &["write -P 0x12 0 5k", "write -c -P 0x34 1M 64k"],
        5 * 65536,
        0x9abc_def1,
    );
    fuzz_one(
        &d,
        "zstd",
        "cluster_size=16384,compression_type=zstd",
        &["write -c -P 0x34 0 64k"],
        6 * 16384,
        0x5555_aaaa,
    );
    fuzz_one(
        &d,
        "v2",
        "compat=0.10,cluster_size=512",
        &["write -P 0x12 0 20k"],
        12 * 512,
        0x7777_1111,
    );
}
