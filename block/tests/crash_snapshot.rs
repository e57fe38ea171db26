//! Crash consistency of internal snapshot operations: a child process
//! creates, applies and deletes snapshots in a loop on an image full of
//! data; the parent kills it with SIGKILL at a random moment, 30 times
//! over. A crash may leak clusters, nothing else: `qemu-img check` must
//! find no corruption, the active disk must read as before, and every
//! snapshot qemu-img still lists must, applied by qemu-img on a copy,
//! read as before too (all of them were taken of the same data).
//!
//! The child is this test binary re-run with `SNAPCRASH_IMG` set and the
//! `snapshot_crash_child` filter.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use block::{Disk, DiskOptions, ImageType};
use support::*;

const ROUNDS: u64 = 30;
const SIZE: u64 = 4 << 20;

/// The child: snapshot operations until killed (bounded otherwise).
#[test]
fn snapshot_crash_child() {
    let Ok(img) = std::env::var("SNAPCRASH_IMG") else {
        return; // Not in child mode.
    };
    let mut opts = DiskOptions::new(&img);
    opts.image_type = ImageType::Qcow2;
    let disk = Disk::open(&opts).expect("child: open");
    let f = disk.format();
    for i in 0..100_000u32 {
        let name = format!("s{i}");
        f.snapshot_create(&name, (1_700_000_000 + i, 0))
            .expect("child: create");
        f.snapshot_apply(&name).expect("child: apply");
        if i > 0 {
            f.snapshot_delete(&format!("s{}", i - 1))
                .expect("child: delete");
        }
    }
}

fn round(dir: &TempDir, seed: u64) {
    let img = dir.join(format!("snap-{seed}.qcow2"));
    let img_s = s(&img).to_string();
    let cluster = if seed.is_multiple_of(2) {
        "65536"
    } else {
        "4096"
    };
    qemu_create(
        "qcow2",
        &img_s,
        &SIZE.to_string(),
        &format!("cluster_size={cluster}"),
    );
    let data = pattern(seed, SIZE as usize);
    let raw = dir.join(format!("snap-{seed}.src"));
    std::fs::write(&raw, &data).unwrap();
    run("qemu-io", &["-f", "qcow2", "-c", "write -z 1M 64k", &img_s]);
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "qcow2", s(&raw), &img_s],
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "snapshot_crash_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SNAPCRASH_IMG", &img)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut rng = Rng::scrambled(seed ^ 0x5a5a);
    std::thread::sleep(Duration::from_millis(20 + rng.below(400)));
    child.kill().expect("SIGKILL the child");
    child.wait().unwrap();

    let check = qemu_check_leaks_only(&img, &format!("seed {seed}, after the crash"));
    let leaked = if check.contains("leaked") {
        "leaks"
    } else {
        "clean"
    };
    let read_back = |image: &str, what: &str| {
        let out = dir.join(format!("snap-{seed}.raw"));
        run("qemu-img", &["convert", "-O", "raw", image, s(&out)]);
        assert_same(
            &std::fs::read(&out).unwrap(),
            &data,
            &format!("seed {seed}: {what}"),
        );
    };
    read_back(&img_s, "active disk");
    let list = run("qemu-img", &["snapshot", "-l", &img_s]);
    eprintln!(
        "seed {seed}: check {leaked}, {} snapshot(s) left",
        list.lines().count().saturating_sub(2)
    );
    for line in list.lines().skip(2) {
        let Some(name) = line.split_whitespace().nth(1) else {
            continue;
        };
        let copy = dir.join(format!("snap-{seed}-{name}.qcow2"));
        std::fs::copy(&img, &copy).unwrap();
        run("qemu-img", &["snapshot", "-a", name, s(&copy)]);
        read_back(s(&copy), &format!("snapshot {name}"));
    }
}

#[test]
fn killed_snapshot_operations_only_leak() {
    let dir = TempDir::new("snapcrash");
    for seed in 0..ROUNDS {
        round(&dir, seed);
    }
}
