//! Randomized writes, write-zeroes, discards, flushes and reopens on qcow2
//! images of many shapes (backing chains, snapshots, compressed data that
//! qemu-img or our own `write_compressed` wrote, extended L2, v2), compared
//! with a raw reference after every few steps and checked with `qemu-img
//! check` and `qemu-img compare` at the end. `QCOW2_RANDOM_ROUNDS=n` runs longer, `QCOW2_RANDOM_SEED=n` varies it.

mod support;

use support::*;

struct Shape {
    name: &'static str,
    create: &'static str,
    backing: bool,
    prep: &'static [&'static str],
    snapshot: bool,
    compress_base: bool,
    /// Fill the first 3 MiB with clusters written by our own
    /// `CompressedWrites::write_compressed` (mostly compressible, some not).
    compress_ours: bool,
}

/// Data that compresses: runs of one byte, the byte and run length drawn
/// from `seed`; every fourth cluster is random (incompressible).
fn compressible(seed: u64, len: usize, cluster: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        if (v.len() / cluster) % 4 == 3 {
            let mut c = vec![0u8; cluster.min(len - v.len())];
            rng.fill(&mut c);
            v.extend_from_slice(&c);
            continue;
        }
        let run = 1 + rng.below(300) as usize;
        let byte = rng.below(256) as u8;
        let n = run.min(len - v.len()).min(cluster - v.len() % cluster);
        v.extend(std::iter::repeat_n(byte, n));
    }
    v
}

const SIZE: u64 = 6 << 20;

fn seed() -> u64 {
    std::env::var("QCOW2_RANDOM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x1000)
}

fn rounds() -> usize {
    std::env::var("QCOW2_RANDOM_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120)
}

fn run_shape(d: &TempDir, sh: &Shape, seed: u64) {
    let img = d.join(format!("{}.qcow2", sh.name));
    let r = Reference::new(d.join(format!("{}.raw", sh.name)), SIZE);
    if sh.compress_base {
        // Compressed clusters of random data in the image itself.
        let src = d.join(format!("{}-src.raw", sh.name));
        let data = pattern(seed, 3 << 20);
        std::fs::write(&src, &data).unwrap();
        run(
            "qemu-img",
            &[
                "convert",
                "-c",
                "-O",
                "qcow2",
                "-o",
                sh.create,
                s(&src),
                s(&img),
            ],
        );
        run("qemu-img", &["resize", "-q", s(&img), &SIZE.to_string()]);
        r.write(0, &data);
    } else if sh.backing {
        let base = d.join(format!("{}-base.qcow2", sh.name));
        qemu_create("qcow2", s(&base), "4M", "");
        run("qemu-io", &["-c", "write -P 0x5b 0 4M", s(&base)]);
        r.write(0, &vec![0x5b; 4 << 20]);
        let bname = format!("{}-base.qcow2", sh.name);
        qemu_create_overlay(
            "qcow2",
            s(&img),
            Some(&SIZE.to_string()),
            sh.create,
            &bname,
            "qcow2",
        );
    } else {
        qemu_create("qcow2", s(&img), &SIZE.to_string(), sh.create);
    }
    if sh.compress_ours {
        let f = open(&img, false);
        let cluster = f.info().cluster_size.unwrap() as usize;
        let data = compressible(seed, 3 << 20, cluster);
        let mut packed = 0;
        for (i, c) in data.chunks(cluster).enumerate() {
            let off = (i * cluster) as u64;
            if f.write_compressed(off, c).unwrap() {
                packed += 1;
            } else {
                write(&*f, off, c);
            }
        }
        assert!(
            packed > data.len() / cluster / 2,
            "{}: {packed} compressed",
            sh.name
        );
        f.close().unwrap();
        drop(f);
        qemu_check(&img);
        r.write(0, &data);
    }
    for cmd in sh.prep {
        run("qemu-io", &["-c", cmd, s(&img)]);
    }
    // Mirror the prep writes (all "write -P 0x77 off len").
    for cmd in sh.prep {
        let parts: Vec<&str> = cmd.split_whitespace().collect();
        let parse = |v: &str| ch_util::size::parse_size(v).unwrap();
        r.write(parse(parts[3]), &vec![0x77; parse(parts[4]) as usize]);
    }
    if sh.snapshot {
        run("qemu-img", &["snapshot", "-c", "s1", s(&img)]);
    }
    let mut f = open(&img, false);
    let mut x = seed | 1;
    for i in 0..rounds() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x >> 8) % SIZE;
        let len = (((x >> 32) % 150_000).max(1)).min(SIZE - off);
        match x % 10 {
            0 => {
                write_zeroes(&*f, off, len, x & 1 == 0);
                r.write(off, &vec![0; len as usize]);
            }
            1 => {
                discard(&*f, off, len);
                r.write(off, &vec![0; len as usize]);
            }
            2 => f.flush_metadata().unwrap(),
            3 if i % 3 == 0 => {
                // Reopen: whatever was committed must have been published.
                f.close().unwrap();
                drop(f);
                f = open(&img, false);
            }
            _ => {
                let data = pattern(x, len as usize);
                write(&*f, off, &data);
                r.write(off, &data);
            }
        }
        if i % 7 == 0 {
            let o = (x >> 16) % SIZE;
            let l = (SIZE - o).min(400_000) as usize;
            assert_same(
                &read(&*f, o, l),
                &r.read(o, l),
                &format!("{} round {i}", sh.name),
            );
        }
    }
    close_and_verify(f, &img, &r, SIZE as usize, sh.name);
}

#[test]
fn random_operations_on_many_image_shapes() {
    let d = temp_dir("random");
    let shapes = [
        Shape {
            name: "plain",
            create: "cluster_size=65536",
            backing: false,
            prep: &[],
            snapshot: false,
            compress_base: false,
            compress_ours: false,
        },
        Shape {
            name: "backing-4k",
            create: "cluster_size=4096",
            backing: true,
            prep: &[],
            snapshot: false,
            compress_base: false,
            compress_ours: false,
        },
        Shape {
            name: "v2-backing",
            create: "compat=0.10,cluster_size=16384",
            backing: true,
            prep: &[],
            snapshot: false,
            compress_base: false,
            compress_ours: false,
        },
        Shape {
            name: "snapshot",
            create: "cluster_size=8192",
            backing: false,
            prep: &["write -P 0x77 0 2M"],
            snapshot: true,
            compress_base: false,
            compress_ours: false,
        },
        Shape {
            name: "zstd",
            create: "cluster_size=16384,compression_type=zstd",
            backing: false,
            prep: &[],
            snapshot: false,
            compress_base: true,
            compress_ours: false,
        },
        Shape {
            name: "deflate-snap",
            create: "cluster_size=65536",
            backing: false,
            prep: &[],
            snapshot: true,
            compress_base: true,
            compress_ours: false,
        },
        Shape {
            name: "extl2-backing",
            create: "cluster_size=65536,extended_l2=on",
            backing: true,
            prep: &[],
            snapshot: false,
            compress_base: false,
            compress_ours: false,
        },
        Shape {
            name: "rb1-512",
            create: "cluster_size=512,refcount_bits=1",
            backing: false,
            prep: &["write -P 0x77 1M 100k"],
            snapshot: false,
            compress_base: false,
            compress_ours: false,
        },
        Shape {
            name: "ours-deflate-4k",
            create: "cluster_size=4096",
            backing: false,
            prep: &[],
            snapshot: false,
            compress_base: false,
            compress_ours: true,
        },
        Shape {
            name: "ours-zstd-64k-snap",
            create: "cluster_size=65536,compression_type=zstd",
            backing: false,
            prep: &[],
            snapshot: true,
            compress_base: false,
            compress_ours: true,
        },
        Shape {
            name: "ours-rb2-512",
            create: "cluster_size=512,refcount_bits=2",
            backing: false,
            prep: &[],
            snapshot: false,
            compress_base: false,
            compress_ours: true,
        },
    ];
    for (i, sh) in shapes.iter().enumerate() {
        run_shape(&d, sh, seed() + i as u64 * 7919);
    }
}
