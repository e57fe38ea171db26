//! Issue 27, convert's options beside qemu-img 7.2: `-B`/`-F` and `-o
//! backing_file=` (only what the source's top image holds is written),
//! `-n` (an existing output, which must read as the source afterwards
//! and, for a fully allocated qcow2, map as qemu-img's: issue 34),
//! `-l` (an internal snapshot, by id or name, or `snapshot.id=`/
//! `snapshot.name=`), several sources joined into one disk, and the
//! command lines qemu-img refuses. Each output is compared with qemu-img's
//! output of the same command line: `qemu-img compare` equal, `qemu-img
//! check` clean with the same allocated clusters, and the same map
//! (extents, depth and flags; host offsets aside).

mod img_safety_support;

use img_safety_support::*;
use integration_tests::{qemu_img, qemu_io, TempDir};

/// base.qcow2 (4 MiB of data); top.qcow2 over it with data, a zero
/// cluster and a snapshot s1 taken before a last write; raw.img.
fn sources(dir: &TempDir) {
    let run = |args: &[&str]| {
        ok(
            &timed_in(dir.path(), "qemu-img", args, DEADLINE),
            "qemu-img",
        )
    };
    run(&["create", "-q", "-f", "qcow2", "base.qcow2", "64M"]);
    qemu_io("qcow2", &dir.file("base.qcow2"), &["write -P 1 0 4M"]);
    run(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        "top.qcow2",
    ]);
    qemu_io(
        "qcow2",
        &dir.file("top.qcow2"),
        &["write -P 2 1M 1M", "write -z 3M 64k", "write -P 3 10M 256k"],
    );
    run(&["snapshot", "-c", "s1", "top.qcow2"]);
    qemu_io("qcow2", &dir.file("top.qcow2"), &["write -P 9 0 64k"]);
    run(&["create", "-q", "-f", "raw", "raw.img", "2M"]);
    qemu_io("raw", &dir.file("raw.img"), &["write -P 7 512k 1M"]);
}

/// The map qemu-img prints, host offsets left out.
fn map(path: &str) -> Vec<serde_json::Value> {
    let out = ok(&qemu(&["map", "--output=json", "-U", path]), "qemu-img map");
    let mut v: Vec<serde_json::Value> = serde_json::from_str(&out).expect("map JSON");
    for e in &mut v {
        if let Some(m) = e.as_object_mut() {
            m.remove("offset");
        }
    }
    v
}

/// `qemu-img check --output=json`'s allocated clusters (none for raw).
fn allocated(path: &str) -> Option<u64> {
    let out = qemu(&["check", "--output=json", "-U", path]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).ok()?;
    assert_eq!(v["corruptions"].as_u64().unwrap_or(0), 0, "{path}: {v}");
    assert_eq!(v["leaks"].as_u64().unwrap_or(0), 0, "{path}: {v}");
    v["allocated-clusters"].as_u64()
}

/// Runs `convert OPTIONS.. q.out` and `convert OPTIONS.. c.out` (qemu-img
/// and ch-img) and compares what they wrote.
fn like_qemu_img(dir: &TempDir, options: &[&str]) {
    let (q, c) = (dir.file("q.out"), dir.file("c.out"));
    let _ = (std::fs::remove_file(&q), std::fs::remove_file(&c));
    let mut args = vec!["convert"];
    args.extend(options);
    let theirs = timed_in(
        dir.path(),
        "qemu-img",
        &[&args[..], &["q.out"]].concat(),
        DEADLINE,
    );
    ok(&theirs, &format!("qemu-img {args:?}"));
    let ours = ch_in(dir.path(), &[&args[..], &["c.out"]].concat());
    ok(&ours, &format!("ch-img {args:?}"));
    let same = qemu(&["compare", "-U", &q, &c]);
    assert!(same.status.success(), "{options:?}: {}", stdout(&same));
    assert_eq!(
        allocated(&c),
        allocated(&q),
        "{options:?}: allocated clusters"
    );
    // qemu-img writes the first block of every raw file it creates (for
    // O_DIRECT alignment probing); ch-img leaves it a hole.
    if !options.contains(&"raw") {
        assert_eq!(map(&c), map(&q), "{options:?}: the maps differ");
    }
}

#[test]
fn backing_files_snapshots_and_several_sources_like_qemu_img() {
    let dir = TempDir::new("convert-options");
    sources(&dir);
    for options in [
        &[
            "-O",
            "qcow2",
            "-B",
            "base.qcow2",
            "-F",
            "qcow2",
            "top.qcow2",
        ][..],
        &[
            "-O",
            "qcow2",
            "-o",
            "backing_file=base.qcow2,backing_fmt=qcow2",
            "top.qcow2",
        ],
        &[
            "-c",
            "-O",
            "qcow2",
            "-B",
            "base.qcow2",
            "-F",
            "qcow2",
            "top.qcow2",
        ],
        // A source without a backing file over a backing file: every
        // range is written, zeroes as zero clusters.
        &[
            "-O",
            "qcow2",
            "-B",
            "base.qcow2",
            "-F",
            "qcow2",
            "base.qcow2",
        ],
        &["-O", "qcow2", "-l", "s1", "top.qcow2"],
        &["-O", "qcow2", "-l", "1", "top.qcow2"],
        &["-O", "qcow2", "-l", "snapshot.name=s1", "top.qcow2"],
        &[
            "-O",
            "qcow2",
            "-l",
            "snapshot.id=1,snapshot.name=s1",
            "top.qcow2",
        ],
        &[
            "-O",
            "qcow2",
            "-l",
            "s1",
            "-B",
            "base.qcow2",
            "-F",
            "qcow2",
            "top.qcow2",
        ],
        &["-O", "qcow2", "top.qcow2", "raw.img", "base.qcow2"],
        &["-O", "raw", "raw.img", "top.qcow2"],
    ] {
        like_qemu_img(&dir, options);
    }
}

#[test]
fn n_writes_into_an_existing_image_like_qemu_img() {
    let dir = TempDir::new("convert-n");
    sources(&dir);
    // Targets full of other data, larger than the source.
    for (fmt, make) in [
        ("qcow2", &["create", "-q", "-f", "qcow2", "T", "80M"][..]),
        ("raw", &["create", "-q", "-f", "raw", "T", "80M"]),
    ] {
        for (name, tool) in [("q.t", "qemu-img"), ("c.t", "ch-img")] {
            let target = dir.file(name);
            let mut make = make.to_vec();
            let at = make.len() - 2;
            make[at] = &target;
            qemu_img(&make);
            qemu_io(fmt, &target, &["write -P 0x66 0 80M"]);
            let args = ["convert", "-n", "-O", fmt, "top.qcow2", name];
            let out = if tool == "qemu-img" {
                timed_in(dir.path(), "qemu-img", &args, DEADLINE)
            } else {
                ch_in(dir.path(), &args)
            };
            ok(&out, &format!("{tool} {args:?}"));
        }
        let (q, c) = (dir.file("q.t"), dir.file("c.t"));
        // The first 64 MiB read as the source; the rest keeps its data.
        for t in [&q, &c] {
            let equal = qemu(&["compare", "-U", "-F", fmt, &dir.file("top.qcow2"), t]);
            assert!(
                stdout(&equal).contains("Content mismatch at offset 67108864"),
                "{t}: {}",
                stdout(&equal)
            );
        }
        let same = qemu(&["compare", "-U", "-f", fmt, &q, &c]);
        assert!(same.status.success(), "{fmt}: {}", stdout(&same));
        if fmt == "qcow2" {
            assert_eq!(allocated(&c), allocated(&q), "-n {fmt}");
            // Zero ranges of the source become zero clusters, their host
            // clusters freed, as qemu-img leaves them: the same map, host
            // offsets included.
            let full_map = |p: &str| ok(&qemu(&["map", "--output=json", "-U", p]), "map");
            assert_eq!(full_map(&c), full_map(&q), "-n {fmt}: the maps differ");
        }
    }
}

#[test]
fn refused_like_qemu_img() {
    let dir = TempDir::new("convert-refused");
    sources(&dir);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        &dir.file("small.qcow2"),
        "1M",
    ]);
    for args in [
        &[
            "convert",
            "-O",
            "qcow2",
            "-B",
            "base.qcow2",
            "top.qcow2",
            "x.qcow2",
        ][..],
        &[
            "convert",
            "-O",
            "qcow2",
            "-o",
            "backing_file=base.qcow2",
            "top.qcow2",
            "x.qcow2",
        ],
        &[
            "convert",
            "-O",
            "raw",
            "-B",
            "base.qcow2",
            "-F",
            "qcow2",
            "top.qcow2",
            "x.raw",
        ],
        &[
            "convert",
            "-O",
            "qcow2",
            "-l",
            "nosuch",
            "top.qcow2",
            "x.qcow2",
        ],
        &[
            "convert",
            "-O",
            "qcow2",
            "-l",
            "s1",
            "top.qcow2",
            "raw.img",
            "x.qcow2",
        ],
        &[
            "convert",
            "-n",
            "-O",
            "qcow2",
            "-o",
            "cluster_size=4k",
            "top.qcow2",
            "small.qcow2",
        ],
        &["convert", "-n", "-O", "qcow2", "top.qcow2", "small.qcow2"],
        &["convert", "-n", "-O", "qcow2", "top.qcow2", "missing.qcow2"],
        &["convert", "top.qcow2"],
    ] {
        same_as_qemu_img(dir.path(), args);
        assert!(
            !dir.path().join("x.qcow2").exists(),
            "{args:?} created x.qcow2"
        );
    }
}
