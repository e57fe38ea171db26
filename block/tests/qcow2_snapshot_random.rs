//! Random internal-snapshot operations (create, apply, delete) between
//! random writes, write-zeroes, discards, reopens, grows and shrinks of
//! the disk (so snapshots have different sizes, applying one brings its
//! size back, and a shrink must not touch what snapshots share), on images of a few shapes, against a model of the active disk
//! and of every snapshot.
//! After every snapshot operation `qemu-img check` must be clean; at the
//! end qemu-img applies each remaining snapshot (on a copy) and must read
//! what the model kept for it. `QCOW2_SNAPSHOT_ROUNDS=n` runs longer,
//! `QCOW2_SNAPSHOT_SEED=n` varies it.

mod support;

use std::collections::BTreeMap;

use support::*;

const SIZE: u64 = 4 << 20;
/// The disk grows at most to this.
const MAX_SIZE: u64 = 12 << 20;

fn rounds() -> usize {
    std::env::var("QCOW2_SNAPSHOT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

fn run_shape(d: &TempDir, name: &str, create: &str, seed: u64) {
    let img = d.join(format!("{name}.qcow2"));
    qemu_create("qcow2", s(&img), &SIZE.to_string(), create);
    let mut model = vec![0u8; SIZE as usize];
    let mut snapshots: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut f = open(&img, false);
    let mut rng = Rng::new(seed);
    let mut next = 0u32;
    let v2 = create.contains("compat=0.10");
    for round in 0..rounds() {
        let size = model.len() as u64;
        let off = rng.below(size);
        let len = (1 + rng.below(200_000)).min(size - off);
        let what = format!("{name} round {round}");
        match rng.below(12) {
            0 => {
                next += 1;
                let sn = format!("s{next}");
                f.snapshot_create(&sn, (1_700_000_000 + next, 0)).unwrap();
                snapshots.insert(sn, model.clone());
            }
            1 if !snapshots.is_empty() => {
                let k = rng.below(snapshots.len() as u64) as usize;
                let sn = snapshots.keys().nth(k).unwrap().clone();
                assert!(f.snapshot_apply(&sn).unwrap(), "{what}: apply {sn}");
                model = snapshots[&sn].clone();
            }
            2 if !snapshots.is_empty() => {
                let k = rng.below(snapshots.len() as u64) as usize;
                let sn = snapshots.keys().nth(k).unwrap().clone();
                assert!(f.snapshot_delete(&sn).unwrap(), "{what}: delete {sn}");
                snapshots.remove(&sn);
            }
            3 => {
                write_zeroes(&*f, off, len, rng.below(2) == 0);
                model[off as usize..(off + len) as usize].fill(0);
            }
            4 => {
                discard(&*f, off, len);
                model[off as usize..(off + len) as usize].fill(0);
            }
            7 if size > 1 << 20 => {
                // Shrink to a random whole sector, at least 1 MiB: a table
                // shared with snapshots is copied first, so they keep
                // their data (checked at the end).
                let new_size = (1 << 20) + 512 * rng.below((size - (1 << 20)) / 512);
                if v2 && !snapshots.is_empty() {
                    assert!(f.resize(new_size).is_err(), "{what}: v2 shrink");
                } else {
                    f.resize(new_size)
                        .unwrap_or_else(|e| panic!("{what}: shrink to {new_size}: {e}"));
                    model.truncate(new_size as usize);
                }
            }
            6 if size < MAX_SIZE => {
                // Grow by 512 bytes to 1 MiB, whole sectors (refused for a
                // version 2 image with snapshots, as by qemu-img).
                let new_size = (size + 512 * (1 + rng.below(2048))).min(MAX_SIZE);
                if v2 && !snapshots.is_empty() {
                    assert!(f.resize(new_size).is_err(), "{what}: v2 grow");
                } else {
                    f.resize(new_size)
                        .unwrap_or_else(|e| panic!("{what}: grow to {new_size}: {e}"));
                    model.resize(new_size as usize, 0);
                }
            }
            5 => {
                f.close().unwrap();
                drop(f);
                f = open(&img, false);
            }
            _ => {
                let data = pattern(rng.next(), len as usize);
                write(&*f, off, &data);
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
        }
        // The open image sees the table where the last operation left it.
        let mut listed: Vec<String> = f.info().snapshots.into_iter().map(|s| s.name).collect();
        listed.sort();
        assert_eq!(
            listed,
            snapshots.keys().cloned().collect::<Vec<_>>(),
            "{what}"
        );
        if round % 5 == 0 {
            assert_eq!(f.size(), model.len() as u64, "{what}: size");
            assert_same(&read(&*f, 0, model.len()), &model, &what);
        }
        if round % 10 == 9 {
            f.close().unwrap();
            drop(f);
            qemu_check(&img);
            f = open(&img, false);
        }
    }
    assert_same(&read(&*f, 0, model.len()), &model, name);
    f.close().unwrap();
    drop(f);
    qemu_check(&img);
    for (sn, want) in &snapshots {
        let copy = d.join(format!("{name}-{sn}.qcow2"));
        std::fs::copy(&img, &copy).unwrap();
        run("qemu-img", &["snapshot", "-a", sn, s(&copy)]);
        let raw = d.join(format!("{name}-{sn}.raw"));
        run("qemu-img", &["convert", "-O", "raw", s(&copy), s(&raw)]);
        assert_same(
            &std::fs::read(&raw).unwrap(),
            want,
            &format!("{name}: snapshot {sn}"),
        );
    }
}

#[test]
fn random_snapshot_operations_between_random_io() {
    let d = temp_dir("snaprandom");
    for (i, (name, create)) in [
        ("c64k", "cluster_size=65536"),
        ("c4k", "cluster_size=4096"),
        ("extl2", "cluster_size=65536,extended_l2=on"),
        ("v2-16k", "compat=0.10,cluster_size=16384"),
    ]
    .iter()
    .enumerate()
    {
        let seed = std::env::var("QCOW2_SNAPSHOT_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0x5eed);
        run_shape(&d, name, create, seed + i as u64 * 7919);
    }
}
