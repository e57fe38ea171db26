//! Differential test of qcow2 writes: seeded random writes, write-zeroes,
//! discards and flushes (crossing cluster boundaries) on a qcow2 image and
//! on an in-memory model, compared after every step.
//!
//! Each step checks the touched range plus one random probe; the whole
//! disk is compared every `FULL_EVERY` steps and at the end. At the end
//! the image is closed, `qemu-img check` must be clean and `qemu-img
//! compare` must find it equal to the model written as a raw file. Run
//! with `DIFF_SEED=n` to replay another seed and `DIFF_STEPS=n` for longer
//! runs; a failure prints the seed,
//! the step and the last operations.

mod support;

use block::{Disk, DiskOptions, ImageType};
use support::*;

const FULL_EVERY: usize = 500;
const SECTOR: u64 = 512;

#[derive(Debug, Clone, Copy)]
enum Op {
    Write { off: u64, len: u64 },
    Zeroes { off: u64, len: u64, unmap: bool },
    Discard { off: u64, len: u64 },
    Flush,
    Read { off: u64, len: u64 },
}

struct Config {
    name: &'static str,
    cluster: u64,
    size: u64,
    backing: bool,
    steps: usize,
    seed: u64,
}

fn pick(rng: &mut Rng, c: &Config) -> Op {
    let sectors = c.size / SECTOR;
    // Ranges up to three clusters (at least 8 sectors), sector aligned,
    // starting anywhere: they cross cluster boundaries often.
    let max_len = (3 * c.cluster).max(8 * SECTOR) / SECTOR;
    let range = |rng: &mut Rng| {
        // Half the ranges start just before a cluster boundary; most are
        // short, one in five spans up to three clusters.
        let off = if rng.below(2) == 0 {
            let boundary = (1 + rng.below(c.size / c.cluster - 1)) * c.cluster;
            boundary.saturating_sub((1 + rng.below(8)) * SECTOR)
        } else {
            rng.below(sectors) * SECTOR
        };
        let len = if rng.below(5) == 0 {
            1 + rng.below(max_len)
        } else {
            1 + rng.below(16)
        } * SECTOR;
        (off, len.min(c.size - off))
    };
    match rng.below(100) {
        0..=44 => {
            let (off, len) = range(rng);
            Op::Write { off, len }
        }
        45..=59 => {
            let (off, len) = range(rng);
            Op::Zeroes {
                off,
                len,
                unmap: rng.below(2) == 0,
            }
        }
        60..=69 => {
            // Whole clusters only: partial-cluster discards may keep data.
            let clusters = c.size / c.cluster;
            let first = rng.below(clusters);
            let n = (1 + rng.below(3)).min(clusters - first);
            Op::Discard {
                off: first * c.cluster,
                len: n * c.cluster,
            }
        }
        70..=74 => Op::Flush,
        _ => {
            let (off, len) = range(rng);
            Op::Read { off, len }
        }
    }
}

fn read_disk(disk: &Disk, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    disk.read_at(off, &mut buf)
        .unwrap_or_else(|e| panic!("read {off}+{len}: {e}"));
    buf
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

fn run(c: &Config) {
    let seed = std::env::var("DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(c.seed);
    let dir = temp_dir(c.name);
    let img = dir.join("img.qcow2");
    let img_s = img.to_str().unwrap();
    let mut rng = Rng::scrambled(seed);
    let mut model = vec![0u8; c.size as usize];
    let cs = c.cluster.to_string();
    if c.backing {
        let base = dir.join("base.raw");
        rng.fill(&mut model);
        // Leave some of the base as zeroes, so zero/unallocated paths differ.
        model[..(c.size / 8) as usize].fill(0);
        std::fs::write(&base, &model).unwrap();
        qemu_create_overlay(
            "qcow2",
            img_s,
            None,
            &format!("cluster_size={cs}"),
            "base.raw",
            "raw",
        );
    } else {
        qemu_create(
            "qcow2",
            img_s,
            &c.size.to_string(),
            &format!("cluster_size={cs}"),
        );
    }
    let mut opts = DiskOptions::new(&img);
    opts.image_type = ImageType::Format("qcow2");
    let disk = Disk::open(&opts).unwrap_or_else(|e| panic!("open {}: {e}", img.display()));
    assert_eq!(disk.size(), c.size);
    let mut log: Vec<Op> = Vec::new();
    let fail = |log: &[Op], step: usize, what: String| -> ! {
        let tail: Vec<String> = log
            .iter()
            .rev()
            .take(12)
            .rev()
            .map(|o| format!("{o:?}"))
            .collect();
        panic!(
            "{} seed {seed} step {step}: {what}\nlast ops:\n{}",
            c.name,
            tail.join("\n")
        );
    };
    for step in 0..c.steps {
        let op = pick(&mut rng, c);
        log.push(op);
        let touched = match op {
            Op::Write { off, len } => {
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data);
                if let Err(e) = disk.write_at(off, &data) {
                    fail(&log, step, format!("write failed: {e}"));
                }
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
                Some((off, len))
            }
            Op::Zeroes { off, len, unmap } => {
                if let Err(e) = disk.write_zeroes(off, len, unmap) {
                    fail(&log, step, format!("write_zeroes failed: {e}"));
                }
                model[off as usize..(off + len) as usize].fill(0);
                Some((off, len))
            }
            Op::Discard { off, len } => {
                if let Err(e) = disk.discard(off, len) {
                    fail(&log, step, format!("discard failed: {e}"));
                }
                model[off as usize..(off + len) as usize].fill(0);
                Some((off, len))
            }
            Op::Flush => {
                if let Err(e) = disk.flush() {
                    fail(&log, step, format!("flush failed: {e}"));
                }
                None
            }
            Op::Read { off, len } => Some((off, len)),
        };
        let probe_off = rng.below(c.size / SECTOR) * SECTOR;
        let probe = (probe_off, (8 * 1024).min(c.size - probe_off));
        for (off, len) in touched.into_iter().chain([probe]) {
            let got = read_disk(&disk, off, len);
            if let Some(i) = first_diff(&got, &model[off as usize..(off + len) as usize]) {
                fail(
                    &log,
                    step,
                    format!(
                        "byte {} differs from the model (read {off}+{len})",
                        off + i as u64
                    ),
                );
            }
        }
        if (step + 1) % FULL_EVERY == 0 {
            let got = read_disk(&disk, 0, c.size);
            if let Some(i) = first_diff(&got, &model) {
                fail(
                    &log,
                    step,
                    format!("full compare: byte {i} differs from the model"),
                );
            }
        }
    }
    let got = read_disk(&disk, 0, c.size);
    assert!(
        first_diff(&got, &model).is_none(),
        "{}: final compare differs",
        c.name
    );
    disk.close().expect("close");
    drop(disk);

    let check = qemu_img_output(&["check", img_s]);
    assert!(
        check.status.success(),
        "{} seed {seed}: qemu-img check is not clean:\n{}{}",
        c.name,
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    qemu_compare_to_model(&dir, &img, "qcow2", &model);
}

fn config(name: &'static str, cluster: u64, backing: bool, seed: u64) -> Config {
    let size = if cluster <= 4096 { 2 << 20 } else { 4 << 20 };
    // 4 configurations x 2,500 = 10,000 operations per run; DIFF_STEPS=n
    // runs longer.
    let steps = std::env::var("DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_500);
    Config {
        name,
        cluster,
        size,
        backing,
        steps,
        seed,
    }
}

#[test]
fn differential_64k_clusters() {
    run(&config("64k", 65536, false, 1));
}

#[test]
fn differential_64k_clusters_with_backing() {
    run(&config("64k-backing", 65536, true, 2));
}

#[test]
fn differential_512b_clusters() {
    run(&config("512", 512, false, 3));
}

#[test]
fn differential_512b_clusters_with_backing() {
    run(&config("512-backing", 512, true, 4));
}
