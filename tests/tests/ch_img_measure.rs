//! `ch-img measure` against `qemu-img measure` 7.2: `--size` for every
//! geometry, copies of images of every kind, and the command lines both
//! refuse.

mod ch_img_support;

use ch_img_support::{code, sample_qcow2};
use integration_tests::{
    ch, ch_status, json, qemu_create_overlay, qemu_img, qemu_img_status, qemu_io, TempDir,
};

/// `measure ARGS` by qemu-img and by ch-img, in both output formats; both
/// must succeed and print the same. Returns qemu-img's JSON.
fn assert_measure_like_qemu(args: &[&str]) -> serde_json::Value {
    let mut answer = serde_json::Value::Null;
    for out in ["--output=human", "--output=json"] {
        let mut full = vec!["measure", out];
        full.extend_from_slice(args);
        let q = qemu_img(&full);
        assert_eq!(q, ch(&full), "{full:?}");
        if out == "--output=json" {
            answer = json(&q);
        }
    }
    answer
}

/// `measure --size` for qcow2 and raw outputs: the metadata of a fully
/// allocated image (header, L2 and L1 tables, refcount blocks and table)
/// for every geometry, and what preallocation changes.
#[test]
fn measure_size_matches_qemu_img() {
    let gib_plus_one = ((1u64 << 30) + 1).to_string();
    for size in ["0", "1", "512", "1G", &gib_plus_one, "100G"] {
        for opts in [
            "cluster_size=512",
            "cluster_size=64k",
            "cluster_size=2M",
            "refcount_bits=1",
            "refcount_bits=64",
            "refcount_bits=1,cluster_size=512",
            "refcount_bits=64,cluster_size=512",
            "extended_l2=on",
            "extended_l2=on,cluster_size=2M",
            "preallocation=full",
            "preallocation=metadata",
            "preallocation=falloc",
            "compat=0.10",
            "compat=0.10,preallocation=full,cluster_size=4k",
        ] {
            assert_measure_like_qemu(&["-O", "qcow2", "-o", opts, "--size", size]);
        }
        assert_measure_like_qemu(&["-O", "qcow2", "--size", size]);
        assert_measure_like_qemu(&["-O", "raw", "--size", size]);
        // raw is the default output format.
        assert_measure_like_qemu(&["--size", size]);
    }
    // The numbers themselves, so that the comparison above cannot pass
    // on an empty answer: 1 GiB with 64 KiB clusters needs a header, two
    // L2 tables, an L1 table, a refcount block and a refcount table.
    let m = assert_measure_like_qemu(&["-O", "qcow2", "--size", "1G"]);
    assert_eq!(m["required"], 6 * 65536);
    assert_eq!(m["fully-allocated"], (1u64 << 30) + 6 * 65536);
    let m = assert_measure_like_qemu(&["--size", "1"]);
    assert_eq!(m["required"], 512);
    assert!(m.get("bitmaps").is_none());
}

/// `measure FILE`: the data clusters a copy needs, found through the
/// image's block status and its backing chain, rounded to the output's
/// clusters; the bitmaps line for qcow2 v3 images.
#[test]
fn measure_images_matches_qemu_img() {
    let dir = TempDir::new("cli");
    let sparse = sample_qcow2(&dir, "s.qcow2");
    let holes = dir.file("holes.raw");
    qemu_img(&["create", "-q", "-f", "raw", &holes, "8M"]);
    qemu_io(
        "raw",
        &holes,
        &["write -P 0x31 512k 4k", "write -P 0x32 3M 130k"],
    );
    let top = dir.file("top.qcow2");
    qemu_create_overlay(&top, "s.qcow2", "qcow2");
    qemu_io("qcow2", &top, &["write -P 0x11 8M 1k", "write -z 0 64k"]);
    let small = dir.file("small.qcow2");
    let opts = "cluster_size=4k,compat=0.10";
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", opts, &small, "3M"]);
    qemu_io(
        "qcow2",
        &small,
        &["write -P 1 1k 1k", "write -P 2 20k 100k", "write -P 3 2M 1"],
    );
    let empty_qcow2 = dir.file("empty.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &empty_qcow2, "0"]);
    let empty_raw = dir.file("empty.raw");
    qemu_img(&["create", "-q", "-f", "raw", &empty_raw, "0"]);
    let bitmaps = dir.file("bitmaps.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &bitmaps, "100M"]);
    qemu_img(&["bitmap", "--add", &bitmaps, "b1"]);
    // A long name: with 512-byte clusters the directory takes two.
    let long_name = "a-long-bitmap-name-".repeat(30);
    qemu_img(&["bitmap", "--add", "-g", "512", &bitmaps, &long_name]);
    // Every cluster is mapped, but only one was written: the rest reads
    // as zeroes although it has a host offset.
    let prealloc = dir.file("prealloc.qcow2");
    let opts = "preallocation=metadata";
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", opts, &prealloc, "5M"]);
    qemu_io("qcow2", &prealloc, &["write -P 7 1M 4k"]);
    for image in [
        &sparse,
        &holes,
        &top,
        &small,
        &empty_qcow2,
        &empty_raw,
        &bitmaps,
        &prealloc,
    ] {
        for opts in [
            "cluster_size=64k",
            "cluster_size=512",
            "cluster_size=2M",
            "refcount_bits=1,extended_l2=on",
            "preallocation=full",
            "compat=0.10",
            "backing_file=base.qcow2",
        ] {
            assert_measure_like_qemu(&["-O", "qcow2", "-o", opts, image]);
        }
        assert_measure_like_qemu(&["-O", "qcow2", image]);
        assert_measure_like_qemu(&["-O", "raw", image]);
        assert_measure_like_qemu(&[image]);
    }
    // A raw view of a qcow2 file has no bitmaps line.
    let m = assert_measure_like_qemu(&["-f", "raw", "-O", "qcow2", &bitmaps]);
    assert!(m.get("bitmaps").is_none());
    // What the comparisons rest on. 16 MiB takes a header, one L2 table,
    // an L1 table, a refcount block and a refcount table. The sparse
    // image needs its three data clusters (its zero cluster and the
    // unwritten ranges need none). The overlay needs the base's second
    // and 5M clusters and its own at 8M, not the base's first one, which
    // its zero cluster hides.
    let meta = 5 * 65536;
    let m = assert_measure_like_qemu(&["-O", "qcow2", &sparse]);
    assert_eq!(m["required"], meta + 3 * 65536, "{m}");
    assert_eq!(m["fully-allocated"], meta + (16 << 20), "{m}");
    assert_eq!(m["bitmaps"], 0);
    let m = assert_measure_like_qemu(&["-O", "qcow2", &top]);
    assert_eq!(m["required"], meta + 3 * 65536, "{m}");
    // With a backing file every cluster counts.
    let m = assert_measure_like_qemu(&["-O", "qcow2", "-o", "backing_file=x", &top]);
    assert_eq!(m["required"], m["fully-allocated"], "{m}");
    let m = assert_measure_like_qemu(&["-O", "qcow2", &prealloc]);
    assert_eq!(m["required"], 5 * 65536 + 65536, "{m}");
    // Per bitmap one data cluster and one bitmap table cluster, and one
    // directory cluster.
    let m = assert_measure_like_qemu(&["-O", "qcow2", &bitmaps]);
    assert_eq!(m["bitmaps"], 5 * 65536, "{m}");
    let m = assert_measure_like_qemu(&["-O", "qcow2", "-o", "compat=0.10", &bitmaps]);
    assert!(m.get("bitmaps").is_none());
}

/// Bad command lines and options fail with exit status 1 on both.
#[test]
fn measure_refuses_what_qemu_img_refuses() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "s.qcow2");
    let missing = dir.file("missing.qcow2");
    for args in [
        &["measure"][..],
        &["measure", "--size", "1G", &img],
        &["measure", &img, &img],
        &["measure", "--size", "12X"],
        &["measure", "--size", "8E"],
        &["measure", "--size", "1M", "-f", "qcow2"],
        &["measure", "--size", "1M", "--output=xml"],
        &["measure", "--size", "1M", "-O", "vmdk"],
        &["measure", "-O", "qcow2", "-o", "size=1M"],
        &["measure", "-O", "qcow2", "-o", "bogus=1", "--size", "1M"],
        &[
            "measure",
            "-O",
            "raw",
            "-o",
            "cluster_size=4k",
            "--size",
            "1M",
        ],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "cluster_size=1000",
            "--size",
            "1M",
        ],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "cluster_size=4M",
            "--size",
            "1M",
        ],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "refcount_bits=3",
            "--size",
            "1M",
        ],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "compat=0.10,refcount_bits=8",
            "--size",
            "1M",
        ],
        &["measure", "-O", "qcow2", "-o", "compat=2", "--size", "1M"],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "preallocation=foo",
            "--size",
            "1M",
        ],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "lazy_refcounts=maybe",
            "--size",
            "1M",
        ],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "extended_l2=on,cluster_size=8k",
            "--size",
            "1M",
        ],
        &[
            "measure",
            "-O",
            "qcow2",
            "-o",
            "cluster_size=512",
            "--size",
            "129G",
        ],
        &["measure", "-O", "qcow2", "--size", "7E"],
        &["measure", "-l", "nosuchsnapshot", &img],
        &["measure", &missing],
    ] {
        assert_eq!(code(&qemu_img_status(args)), 1, "qemu-img {args:?}");
        assert_eq!(code(&ch_status(args)), 1, "ch-img {args:?}");
    }
    // -s is not qemu-img's snapshot option; ch-img names the problem.
    let s = ch_status(&["measure", "-s", "snap", &img]);
    assert_eq!(code(&s), 1);
    assert!(String::from_utf8_lossy(&s.stderr).contains("internal snapshot"));
    // Right at qemu's L1 table limit, the 128 GiB disk is fine.
    assert_measure_like_qemu(&["-O", "qcow2", "-o", "cluster_size=512", "--size", "128G"]);
}
