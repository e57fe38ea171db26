//! ch-img's command line against qemu-img's: the same verbs on the same
//! images give the same output (text or JSON) and the same exit status.

use std::os::unix::fs::FileExt;

use integration_tests::{
    ch, ch_status, json, qemu_create_overlay, qemu_create_qcow2, qemu_img, qemu_img_status,
    qemu_io, TempDir,
};

/// stdout of a run with the tool's own name and the file names neutralised.
fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn code(o: &std::process::Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// A 16 MiB qcow2 image with data, a zero cluster and a hole.
/// `qemu-img map --output=json` without the host offsets (which follow
/// allocation order): the extents and their flags.
fn layout(img: &str) -> serde_json::Value {
    let mut j = json(&qemu_img(&["map", "--output=json", img]));
    for e in j.as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("offset");
    }
    j
}

fn sample_qcow2(dir: &TempDir, name: &str) -> String {
    let img = dir.file(name);
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    qemu_io(
        "qcow2",
        &img,
        &[
            "write -P 0xab 0 100k",
            "write -z 1M 64k",
            "write -P 0xcd 5M 4k",
        ],
    );
    img
}

#[test]
fn create_prints_qemu_img_formatting_line() {
    let dir = TempDir::new("cli");
    for (fmt, opts, size) in [
        ("raw", None, "1M"),
        ("qcow2", None, "10M"),
        ("qcow2", Some("cluster_size=4096,lazy_refcounts=on"), "1G"),
        ("qcow2", Some("refcount_bits=64,extended_l2=on"), "3G"),
        ("qcow2", Some("compression_type=zstd"), "5M"),
    ] {
        let q = dir.file("q.img");
        let c = dir.file("c.img");
        let mut qa = vec!["create", "-f", fmt];
        let mut ca = qa.clone();
        if let Some(o) = opts {
            qa.extend(["-o", o]);
            ca.extend(["-o", o]);
        }
        qa.extend([q.as_str(), size]);
        ca.extend([c.as_str(), size]);
        let qo = qemu_img(&qa).replace(&q, "IMG");
        let co = ch(&ca).replace(&c, "IMG");
        assert_eq!(qo, co, "create {fmt} {opts:?}");
        // The image qemu-img reads back is what we asked for, and clean.
        let info = json(&qemu_img(&["info", "--output=json", &c]));
        assert_eq!(info["format"], fmt);
        assert_eq!(
            info["virtual-size"],
            json(&qemu_img(&["info", "--output=json", &q]))["virtual-size"]
        );
        if fmt == "qcow2" {
            qemu_img(&["check", &c]);
            assert_eq!(
                info["format-specific"],
                json(&qemu_img(&["info", "--output=json", &q]))["format-specific"],
                "{opts:?}"
            );
        }
    }
}

#[test]
fn create_with_backing_file_takes_its_size() {
    let dir = TempDir::new("cli");
    let base = sample_qcow2(&dir, "base.qcow2");
    let top = dir.file("top.qcow2");
    ch(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        &top,
    ]);
    let info = json(&qemu_img(&["info", "--output=json", &top]));
    assert_eq!(info["virtual-size"], 16 << 20);
    assert_eq!(info["backing-filename"], "base.qcow2");
    assert_eq!(info["backing-filename-format"], "qcow2");
    qemu_img(&["compare", &base, &top]);
    // The "Formatting" line shows the size taken from the backing file.
    let (q, c) = (dir.file("q.qcow2"), dir.file("c.qcow2"));
    let qo = qemu_img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        &q,
    ]);
    let co = ch(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        &c,
    ]);
    assert_eq!(qo.replace(&q, "IMG"), co.replace(&c, "IMG"));
    // Like qemu-img 7.2, no guessing of the backing format.
    let x = dir.file("x.qcow2");
    assert_eq!(
        code(&qemu_img_status(&[
            "create",
            "-f",
            "qcow2",
            "-b",
            "base.qcow2",
            &x
        ])),
        1
    );
    assert_eq!(
        code(&ch_status(&[
            "create",
            "-f",
            "qcow2",
            "-b",
            "base.qcow2",
            &x
        ])),
        1
    );
}

/// A zero-size qcow2 has an empty L1 table and no cluster for it, as
/// qemu-img makes it (before, ch-img reserved one: qemu-img check found
/// it leaked); it grows and takes writes like any other.
#[test]
fn create_zero_size_qcow2_is_clean_and_grows() {
    let dir = TempDir::new("cli");
    let ours = dir.file("ours.qcow2");
    let theirs = dir.file("theirs.qcow2");
    ch(&["create", "-q", "-f", "qcow2", &ours, "0"]);
    qemu_img(&["create", "-q", "-f", "qcow2", &theirs, "0"]);
    assert_eq!(code(&qemu_img_status(&["check", &ours])), 0);
    let len = |p: &str| std::fs::metadata(p).unwrap().len();
    assert_eq!(len(&ours), len(&theirs));
    ch(&["resize", "-q", &ours, "+1M"]);
    qemu_img(&["resize", "-q", &theirs, "+1M"]);
    qemu_io("qcow2", &ours, &["write -P 0x33 0 64k"]);
    qemu_io("qcow2", &theirs, &["write -P 0x33 0 64k"]);
    assert_eq!(code(&qemu_img_status(&["check", &ours])), 0);
    qemu_img(&["compare", &ours, &theirs]);
}

#[test]
fn create_rejects_bad_sizes_and_options() {
    let dir = TempDir::new("cli");
    let img = dir.file("x.qcow2");
    assert_eq!(code(&ch_status(&["create", "-f", "qcow2", &img, "12X"])), 1);
    assert_eq!(
        code(&ch_status(&[
            "create", "-f", "qcow2", "-o", "bogus=1", &img, "1M"
        ])),
        1
    );
    assert_eq!(code(&ch_status(&["create", "-f", "qcow2", &img])), 1);
    assert_eq!(code(&ch_status(&["create", "-f", "vmdk", &img, "1M"])), 1);
}

#[test]
fn info_matches_qemu_img_raw() {
    let dir = TempDir::new("cli");
    let img = dir.file("r.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "3M"]);
    qemu_io("raw", &img, &["write -P 1 0 64k"]);
    for out in ["human", "json"] {
        let o = format!("--output={out}");
        assert_eq!(
            qemu_img(&["info", &o, &img]),
            ch(&["info", &o, &img]),
            "{out}"
        );
    }
}

#[test]
fn info_matches_qemu_img_qcow2() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "s.qcow2");
    let top = dir.file("top.qcow2");
    qemu_create_overlay(&top, "s.qcow2", "qcow2");
    let v2 = dir.file("v2.qcow2");
    qemu_create_qcow2(&v2, "compat=0.10", "1M");
    let data = dir.file("data.qcow2");
    let opts = format!("data_file={},data_file_raw=on", dir.file("data.raw"));
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", &opts, &data, "1M"]);
    let zstd = dir.file("zstd.qcow2");
    let opts = "compression_type=zstd,extended_l2=on,refcount_bits=64,lazy_refcounts=on";
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", opts, &zstd, "1M"]);
    for image in [&img, &top, &v2, &data, &zstd] {
        for out in ["human", "json"] {
            let o = format!("--output={out}");
            assert_eq!(
                qemu_img(&["info", &o, image]),
                ch(&["info", &o, image]),
                "{image} {out}"
            );
        }
    }
}

#[test]
fn map_matches_qemu_img() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "s.qcow2");
    let top = dir.file("top.qcow2");
    qemu_create_overlay(&top, "s.qcow2", "qcow2");
    qemu_io("qcow2", &top, &["write -P 0x11 64k 64k"]);
    for image in [&img, &top] {
        for out in ["human", "json"] {
            let o = format!("--output={out}");
            assert_eq!(
                qemu_img(&["map", &o, image]),
                ch(&["map", &o, image]),
                "{image} {out}"
            );
        }
    }
}

/// Internal snapshots: `snapshot -l` and the "Snapshot list:" /
/// "snapshots" parts of `info`, as qemu-img prints them.
#[test]
fn snapshot_list_and_info_match_qemu_img() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "s.qcow2");
    qemu_img(&["snapshot", "-c", "first", &img]);
    qemu_io("qcow2", &img, &["write -P 0x21 1M 64k"]);
    qemu_img(&[
        "snapshot",
        "-c",
        "a snapshot name longer than sixteen characters",
        &img,
    ]);
    for args in [
        &["snapshot", "-l", &img][..],
        &["snapshot", &img],
        &["info", &img],
        &["info", "--output=json", &img],
    ] {
        assert_eq!(qemu_img(args), ch(args), "{args:?}");
    }
    qemu_img(&["snapshot", "-d", "first", &img]);
    assert_eq!(
        qemu_img(&["snapshot", "-l", &img]),
        ch(&["snapshot", "-l", &img])
    );
    // A snapshot that is not there: an error, and nothing changes.
    let before = std::fs::read(&img).unwrap();
    let c = ch_status(&["snapshot", "-a", "first", &img]);
    assert_eq!(code(&c), 1);
    assert!(
        String::from_utf8_lossy(&c.stderr).contains("Could not apply snapshot 'first'"),
        "{c:?}"
    );
    assert!(std::fs::read(&img).unwrap() == before);
}

/// Snapshots we create hold the disk as it was, whoever writes after
/// (qemu-io, or our own block layer through `ch-img bench -w`); qemu-img
/// applies them; deleting (ours or qemu-img's) leaves a clean image with
/// the active data intact; compressed and zero clusters included.
#[test]
fn snapshot_create_and_delete_keep_data_and_refcounts_right() {
    let dir = TempDir::new("cli");
    for opts in [
        "cluster_size=65536",
        "cluster_size=4096",
        "cluster_size=65536,extended_l2=on",
        "compat=0.10,cluster_size=16384",
    ] {
        let img = dir.file("img.qcow2");
        qemu_img(&["create", "-q", "-f", "qcow2", "-o", opts, &img, "8M"]);
        qemu_io(
            "qcow2",
            &img,
            &[
                "write -P 0x11 0 1M",
                "write -c -P 0x33 2M 64k",
                "write -z 3M 64k",
            ],
        );
        let at_s1 = dir.file("at-s1.qcow2");
        std::fs::copy(&img, &at_s1).unwrap();
        ch(&["snapshot", "-c", "s1", &img]);
        qemu_img(&["check", &img]);
        // Writes after the snapshot: qemu's, then our block layer's.
        qemu_io(
            "qcow2",
            &img,
            &["write -P 0x22 512k 1M", "write -P 0x44 2M 4k"],
        );
        ch(&[
            "bench",
            "-w",
            "-c",
            "64",
            "-s",
            "4096",
            "-S",
            "65536",
            "--pattern=0x55",
            &img,
        ]);
        qemu_img(&["check", &img]);
        let at_s2 = dir.file("at-s2.qcow2");
        std::fs::copy(&img, &at_s2).unwrap();
        qemu_img(&["snapshot", "-c", "s2", &img]);
        qemu_io("qcow2", &img, &["write -P 0x66 0 64k"]);
        let active = dir.file("active.raw");
        qemu_img(&["convert", "-O", "raw", &img, &active]);
        // Each snapshot, applied by qemu-img or by us (by name or id), is
        // the disk at its time, and the applied image stays clean and
        // writable (writes after it must not reach the other snapshot).
        for (name, id, expect) in [("s1", "1", &at_s1), ("s2", "2", &at_s2)] {
            let theirs = dir.file("applied-theirs.qcow2");
            std::fs::copy(&img, &theirs).unwrap();
            qemu_img(&["snapshot", "-a", name, &theirs]);
            qemu_img(&["compare", expect, &theirs]);
            for key in [name, id] {
                let ours = dir.file("applied-ours.qcow2");
                std::fs::copy(&img, &ours).unwrap();
                ch(&["snapshot", "-a", key, &ours]);
                qemu_img(&["check", &ours]);
                qemu_img(&["compare", expect, &ours]);
                ch(&[
                    "bench",
                    "-w",
                    "-c",
                    "32",
                    "-s",
                    "4096",
                    "-S",
                    "131072",
                    "--pattern=0x77",
                    &ours,
                ]);
                qemu_img(&["check", &ours]);
                let other = if name == "s1" { "s2" } else { "s1" };
                let other_at = if name == "s1" { &at_s2 } else { &at_s1 };
                ch(&["snapshot", "-a", other, &ours]);
                qemu_img(&["check", &ours]);
                qemu_img(&["compare", other_at, &ours]);
            }
        }
        // Delete ours and qemu's snapshot; the active disk stays as it was.
        ch(&["snapshot", "-d", "s1", &img]);
        qemu_img(&["check", &img]);
        qemu_img(&["compare", "-F", "raw", &img, &active]);
        ch(&["snapshot", "-d", "s2", &img]);
        qemu_img(&["check", &img]);
        qemu_img(&["compare", "-F", "raw", &img, &active]);
        assert_eq!(ch(&["snapshot", "-l", &img]), "", "{opts}");
        let missing = ch_status(&["snapshot", "-d", "s1", &img]);
        assert_eq!(code(&missing), 1);
        assert!(String::from_utf8_lossy(&missing.stderr).contains("snapshot not found"));
    }
}

/// rebase: safe mode keeps what the disk reads (compared with qemu-img's
/// own rebase of the same image), `-b ""` flattens, `-u` only rewrites
/// the header and keeps the other header extensions (an external data
/// file's name).
#[test]
fn rebase_matches_qemu_img() {
    let dir = TempDir::new("cli");
    std::fs::create_dir_all(dir.file("sub")).unwrap();
    let b1 = dir.file("sub/b1.qcow2");
    let b2 = dir.file("sub/b2.raw");
    let top = dir.file("sub/top.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &b1, "4M"]);
    qemu_io("qcow2", &b1, &["write -P 0x11 0 2M"]);
    qemu_img(&["create", "-q", "-f", "raw", &b2, "3M"]);
    qemu_io("raw", &b2, &["write -P 0x22 1M 2M"]);
    qemu_create_overlay(&top, "b1.qcow2", "qcow2");
    qemu_io(
        "qcow2",
        &top,
        &["write -P 0x33 512k 64k", "write -z 1536k 64k"],
    );
    let info = |img: &str| {
        let mut j = json(&qemu_img(&["info", "--output=json", img]));
        j.as_object_mut().unwrap().remove("actual-size");
        j.as_object_mut().unwrap().remove("filename");
        j
    };
    for args in [
        &["-b", "b2.raw", "-F", "raw"][..],
        &["-b", ""],
        &["-u", "-b", "b2.raw", "-F", "raw"],
        &["-u", "-b", "../sub/b1.qcow2", "-F", "qcow2"],
    ] {
        let theirs = dir.file("sub/theirs.qcow2");
        let ours = dir.file("sub/ours.qcow2");
        std::fs::copy(&top, &theirs).unwrap();
        std::fs::copy(&top, &ours).unwrap();
        let mut q = vec!["rebase"];
        q.extend_from_slice(args);
        let mut c = q.clone();
        q.push(&theirs);
        c.push(&ours);
        qemu_img(&q);
        ch(&c);
        qemu_img(&["check", &ours]);
        assert_eq!(info(&theirs), info(&ours), "{args:?}");
        qemu_img(&["compare", &theirs, &ours]);
        if args[0] != "-u" {
            qemu_img(&["compare", &top, &ours]);
        }
    }
    let c = ch_status(&["rebase", "-b", "b2.raw", &top]);
    assert_eq!(code(&c), 1);
    assert!(String::from_utf8_lossy(&c.stderr).contains("backing format must be specified"));

    // -u keeps the data file extension next to the new backing reference.
    let df = dir.file("sub/df.qcow2");
    let data_opt = format!("data_file={}", dir.file("sub/df.data"));
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-o", &data_opt, "-b", "b1.qcow2", "-F", "qcow2", &df,
    ]);
    let theirs = dir.file("sub/df-theirs.qcow2");
    std::fs::copy(&df, &theirs).unwrap();
    qemu_img(&["rebase", "-u", "-b", "b2.raw", "-F", "raw", &theirs]);
    ch(&["rebase", "-u", "-b", "b2.raw", "-F", "raw", &df]);
    qemu_img(&["check", &df]);
    assert_eq!(info(&theirs), info(&df));
}

/// commit: the backing file ends up as qemu-img's commit leaves it, and
/// the image is emptied (or kept with -d); qcow2 and raw backing files,
/// and a backing file smaller than the image.
#[test]
fn commit_matches_qemu_img() {
    let dir = TempDir::new("cli");
    for (base_fmt, base_size, top_size, keep) in [
        ("qcow2", "4M", None, false),
        ("raw", "4M", None, false),
        ("qcow2", "4M", None, true),
        ("qcow2", "2M", Some("6M"), false),
    ] {
        let mut made = Vec::new();
        for tool in ["theirs", "ours"] {
            let base = dir.file(&format!("base-{tool}.img"));
            let top = dir.file(&format!("top-{tool}.qcow2"));
            qemu_img(&["create", "-q", "-f", base_fmt, &base, base_size]);
            qemu_io(base_fmt, &base, &["write -P 0x11 0 1M"]);
            let mut create = vec!["create", "-q", "-f", "qcow2", "-b"];
            let base_name = format!("base-{tool}.img");
            create.extend([base_name.as_str(), "-F", base_fmt, top.as_str()]);
            if let Some(size) = top_size {
                create.push(size);
            }
            qemu_img(&create);
            qemu_io(
                "qcow2",
                &top,
                &[
                    "write -P 0x22 512k 64k",
                    "write -z 128k 64k",
                    "write -P 0x33 1536k 4k",
                ],
            );
            let before = dir.file(&format!("before-{tool}.raw"));
            qemu_img(&["convert", "-O", "raw", &top, &before]);
            let mut args = vec!["commit"];
            if keep {
                args.push("-d");
            }
            args.push(&top);
            let out = if tool == "theirs" {
                qemu_img(&args)
            } else {
                ch(&args)
            };
            assert_eq!(out, "Image committed.\n");
            qemu_img(&["check", &top]);
            if base_fmt == "qcow2" {
                qemu_img(&["check", &base]);
            }
            // The image still reads as before, and so does its backing file
            // now (over the image's size).
            qemu_img(&["compare", "-F", "raw", &top, &before]);
            qemu_img(&["compare", "-f", base_fmt, "-F", "raw", &base, &before]);
            made.push((base, top));
        }
        let (tb, tt) = &made[0];
        let (ob, ot) = &made[1];
        qemu_img(&["compare", "-f", base_fmt, "-F", base_fmt, tb, ob]);
        // Same extents and flags (host offsets follow allocation order).
        assert_eq!(layout(tt), layout(ot), "{base_fmt} keep={keep}");
        if base_fmt == "qcow2" {
            assert_eq!(layout(tb), layout(ob), "base, keep={keep}");
        }
    }
    let lone = dir.file("lone.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &lone, "1M"]);
    let c = ch_status(&["commit", &lone]);
    assert_eq!(code(&c), 1);
    assert!(String::from_utf8_lossy(&c.stderr).contains("Image does not have a backing file"));
}

/// A snapshot that would push a refcount past refcount_bits is refused
/// before anything changes (qemu-img fails half way with EINVAL).
#[test]
fn snapshot_create_refuses_refcount_overflow_cleanly() {
    let dir = TempDir::new("cli");
    let img = dir.file("rb4.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=4096,refcount_bits=4",
        &img,
        "8M",
    ]);
    // 16 compressed 4 KiB clusters packed into host clusters counted 15.
    qemu_io("qcow2", &img, &["write -c -P 0x33 2M 64k"]);
    let before = std::fs::read(&img).unwrap();
    let c = ch_status(&["snapshot", "-c", "s1", &img]);
    assert_eq!(code(&c), 1);
    assert!(
        String::from_utf8_lossy(&c.stderr).contains("cannot take another reference"),
        "{c:?}"
    );
    assert!(std::fs::read(&img).unwrap() == before);
    qemu_img(&["check", &img]);
}

/// info --backing-chain over qcow2 -> qcow2 -> raw, the chain in a
/// subfolder (relative backing names resolved against each image).
#[test]
fn info_backing_chain_matches_qemu_img() {
    let dir = TempDir::new("cli");
    std::fs::create_dir_all(dir.file("sub")).unwrap();
    let base = dir.file("sub/base.raw");
    let mid = dir.file("sub/mid.qcow2");
    let top = dir.file("sub/top.qcow2");
    qemu_img(&["create", "-q", "-f", "raw", &base, "2M"]);
    qemu_create_overlay(&mid, "base.raw", "raw");
    qemu_create_overlay(&top, "mid.qcow2", "qcow2");
    qemu_io("qcow2", &top, &["write -P 0x11 0 64k"]);
    for out in ["--output=human", "--output=json"] {
        let args = ["info", "--backing-chain", out, &top];
        assert_eq!(qemu_img(&args), ch(&args), "{out}");
    }
}

/// --start-offset / --max-length, including empty and partial ranges.
#[test]
fn map_ranges_match_qemu_img() {
    let dir = TempDir::new("cli");
    let base = sample_qcow2(&dir, "s.qcow2");
    let top = dir.file("top.qcow2");
    qemu_create_overlay(&top, "s.qcow2", "qcow2");
    qemu_io("qcow2", &top, &["write -P 0x11 2M 64k"]);
    for image in [&base, &top] {
        for range in [
            &["--start-offset=65536", "--max-length=2162688"][..],
            &["--start-offset=1000", "--max-length=100"],
            &["--start-offset=1048600"],
            &["--start-offset=1G"],
            &["--max-length=1"],
            &["--start-offset=1k", "--max-length=0"],
        ] {
            for out in ["--output=human", "--output=json"] {
                let mut args = vec!["map", out];
                args.extend_from_slice(range);
                args.push(image);
                assert_eq!(qemu_img(&args), ch(&args), "{args:?}");
            }
        }
    }
    let bad = ch_status(&["map", "--start-offset=abc", &base]);
    assert_eq!(code(&bad), 1);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("Invalid start offset specified"));
}

/// qemu-img's map table cannot show compressed clusters: it prints the
/// header and what came before, then fails with exit status 1.
#[test]
fn human_map_of_compressed_clusters_fails_like_qemu_img() {
    let dir = TempDir::new("cli");
    let img = dir.file("c.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "1M"]);
    qemu_io(
        "qcow2",
        &img,
        &["write -P 0x22 0 64k", "write -c -P 0x11 64k 64k"],
    );
    let q = qemu_img_status(&["map", &img]);
    let c = ch_status(&["map", &img]);
    assert_eq!(code(&q), 1);
    assert_eq!(code(&c), 1);
    assert_eq!(stdout(&q), stdout(&c));
    assert!(
        String::from_utf8_lossy(&c.stderr)
            .contains("File contains external, encrypted or compressed clusters."),
        "{c:?}"
    );
    // The JSON form shows them.
    assert_eq!(
        qemu_img(&["map", "--output=json", &img]),
        ch(&["map", "--output=json", &img])
    );
}

#[test]
fn check_clean_image_matches_qemu_img() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "s.qcow2");
    for out in ["human", "json"] {
        let o = format!("--output={out}");
        let q = qemu_img_status(&["check", &o, &img]);
        let c = ch_status(&["check", &o, &img]);
        assert_eq!(code(&q), 0);
        assert_eq!(code(&c), 0);
        if out == "json" {
            assert_eq!(json(&stdout(&q)), json(&stdout(&c)));
        } else {
            assert_eq!(stdout(&q), stdout(&c));
        }
    }
}

#[test]
fn check_raw_is_not_supported_like_qemu_img() {
    let dir = TempDir::new("cli");
    let img = dir.file("r.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "1M"]);
    let q = qemu_img_status(&["check", &img]);
    let c = ch_status(&["check", &img]);
    assert_eq!(code(&q), 63);
    assert_eq!(code(&c), 63);
    assert!(
        String::from_utf8_lossy(&c.stderr).contains("This image format does not support checks")
    );
}

/// Refcount of cluster `index` set to `value` in the first refcount
/// block (16-bit refcounts), like a crash or a bug would leave it.
fn poke_refcount(img: &str, index: u64, value: u16) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 48).unwrap();
    let table = u64::from_be_bytes(b);
    f.read_exact_at(&mut b, table).unwrap();
    let block = u64::from_be_bytes(b);
    f.write_all_at(&value.to_be_bytes(), block + 2 * index)
        .unwrap();
}

/// Host cluster index of the first data cluster (the first L2 entry).
fn first_data_cluster(img: &str) -> u64 {
    let f = std::fs::File::open(img).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 40).unwrap();
    let l1 = u64::from_be_bytes(b);
    f.read_exact_at(&mut b, l1).unwrap();
    let l2 = u64::from_be_bytes(b) & 0x00ff_ffff_ffff_fe00;
    f.read_exact_at(&mut b, l2).unwrap();
    (u64::from_be_bytes(b) & 0x00ff_ffff_ffff_fe00) >> 16
}

#[test]
fn check_reports_leaks_and_repairs_them() {
    let dir = TempDir::new("cli");
    let q = sample_qcow2(&dir, "q.qcow2");
    // A leak: a refcount past the last used cluster (inside the block).
    let len = std::fs::metadata(&q).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&q)
        .unwrap()
        .set_len(len + 65536)
        .unwrap();
    poke_refcount(&q, len / 65536, 1);
    let c = dir.file("c.qcow2");
    std::fs::copy(&q, &c).unwrap();
    for out in ["human", "json"] {
        let o = format!("--output={out}");
        let qo = qemu_img_status(&["check", &o, &q]);
        let co = ch_status(&["check", &o, &c]);
        assert_eq!(code(&qo), 3);
        assert_eq!(code(&co), 3);
        if out == "json" {
            let mut cj = json(&stdout(&co));
            cj["filename"] = json(&stdout(&qo))["filename"].clone();
            assert_eq!(json(&stdout(&qo)), cj);
        } else {
            assert_eq!(stdout(&qo), stdout(&co));
        }
    }
    let co = ch_status(&["check", "-r", "leaks", &c]);
    assert_eq!(code(&co), 0, "{}", stdout(&co));
    assert!(stdout(&co).contains("1 leaked clusters"));
    assert_eq!(
        code(&qemu_img_status(&["check", &c])),
        0,
        "qemu-img check after ch-img repair"
    );
}

#[test]
fn check_reports_corruption_and_repairs_it() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "q.qcow2");
    let data = first_data_cluster(&img);
    poke_refcount(&img, data, 0);
    let q = qemu_img_status(&["check", &img]);
    let c = ch_status(&["check", &img]);
    assert_eq!(code(&q), 2);
    assert_eq!(code(&c), 2);
    assert_eq!(stdout(&q), stdout(&c));
    assert!(String::from_utf8_lossy(&c.stderr)
        .contains(&format!("ERROR cluster {data} refcount=0 reference=1")));
    let c = ch_status(&["check", "-r", "all", &img]);
    assert_eq!(code(&c), 0, "{}", stdout(&c));
    assert_eq!(
        code(&qemu_img_status(&["check", &img])),
        0,
        "qemu-img check after ch-img -r all"
    );
}

#[test]
fn compare_exit_codes_and_messages() {
    let dir = TempDir::new("cli");
    let a = sample_qcow2(&dir, "a.qcow2");
    let b = dir.file("b.raw");
    qemu_img(&["convert", "-O", "raw", &a, &b]);
    let q = qemu_img_status(&["compare", &a, &b]);
    let c = ch_status(&["compare", &a, &b]);
    assert_eq!((code(&q), stdout(&q)), (code(&c), stdout(&c)));
    assert_eq!(code(&c), 0);
    qemu_io("raw", &b, &["write -P 0x1 5M 1"]);
    let q = qemu_img_status(&["compare", &a, &b]);
    let c = ch_status(&["compare", &a, &b]);
    assert_eq!((code(&q), stdout(&q)), (code(&c), stdout(&c)));
    assert_eq!(
        stdout(&c),
        format!("Content mismatch at offset {}!\n", 5 << 20)
    );
    let missing = dir.file("missing.qcow2");
    assert_eq!(code(&ch_status(&["compare", &a, &missing])), 2);
}

#[test]
fn convert_to_qcow2_stays_sparse_and_equal() {
    let dir = TempDir::new("cli");
    let src = sample_qcow2(&dir, "src.qcow2");
    let raw = dir.file("src.raw");
    ch(&["convert", "-O", "raw", &src, &raw]);
    qemu_img(&["compare", "-f", "qcow2", "-F", "raw", &src, &raw]);
    let out = dir.file("out.qcow2");
    ch(&["convert", "-f", "raw", "-O", "qcow2", &raw, &out]);
    qemu_img(&["check", &out]);
    qemu_img(&["compare", &src, &out]);
    // Only the clusters with data are allocated: 100k + 4k of data.
    let check = json(&qemu_img(&["check", "--output=json", &out]));
    assert_eq!(check["allocated-clusters"], 3, "{check}");
}

/// A source whose clusters are compressible text, random bytes, zeroes
/// and half-zero halves, ending in a partial cluster.
fn mixed_raw(dir: &TempDir, name: &str, cluster: usize) -> String {
    let path = dir.file(name);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut data = Vec::new();
    for i in 0..24 {
        let mut c = vec![0u8; cluster];
        match i % 4 {
            0 => {
                let text = format!("cluster {i} of a compressible image; ");
                for (j, b) in c.iter_mut().enumerate() {
                    *b = text.as_bytes()[j % text.len()];
                }
            }
            1 => {
                for b in c.iter_mut() {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    *b = rng as u8;
                }
            }
            2 => {}
            _ => c[..cluster / 2].fill(0x5a),
        }
        data.extend_from_slice(&c);
    }
    data.extend_from_slice(&b"tail".repeat(cluster / 8));
    std::fs::write(&path, &data).unwrap();
    path
}

/// convert -c: what qemu-img reads back equals the source, `check` is
/// clean, and as many clusters are compressed as qemu-img compresses.
#[test]
fn convert_compressed_matches_qemu_img() {
    let dir = TempDir::new("cli");
    for (opts, cluster) in [
        ("cluster_size=65536", 65536),
        ("cluster_size=65536,compression_type=zstd", 65536),
        ("cluster_size=4096,refcount_bits=1", 4096),
        ("cluster_size=512,compat=0.10", 512),
        ("cluster_size=2M", 2 << 20),
    ] {
        let src = mixed_raw(&dir, "src.raw", cluster);
        let ours = dir.file("ours.qcow2");
        let theirs = dir.file("theirs.qcow2");
        for (tool_out, path) in [(true, &ours), (false, &theirs)] {
            let args = [
                "convert", "-c", "-f", "raw", "-O", "qcow2", "-o", opts, &src, path,
            ];
            if tool_out {
                ch(&args);
            } else {
                qemu_img(&args);
            }
        }
        qemu_img(&["check", &ours]);
        qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &src, &ours]);
        let ours_check = json(&qemu_img(&["check", "--output=json", &ours]));
        let theirs_check = json(&qemu_img(&["check", "--output=json", &theirs]));
        assert!(
            ours_check["compressed-clusters"].as_u64().unwrap_or(0) > 0,
            "{opts}: {ours_check}"
        );
        for key in ["compressed-clusters", "allocated-clusters"] {
            assert_eq!(ours_check[key], theirs_check[key], "{opts}: {key}");
        }
        // And we read our compressed clusters back like qemu's.
        let back = dir.file("back.raw");
        ch(&["convert", "-O", "raw", &ours, &back]);
        qemu_img(&["compare", "-f", "raw", "-F", "raw", &src, &back]);
    }
}

#[test]
fn convert_compressed_refuses_raw_output() {
    let dir = TempDir::new("cli");
    let src = mixed_raw(&dir, "src.raw", 4096);
    let out = dir.file("out.raw");
    let q = qemu_img_status(&["convert", "-c", "-f", "raw", "-O", "raw", &src, &out]);
    let c = ch_status(&["convert", "-c", "-f", "raw", "-O", "raw", &src, &out]);
    assert_eq!(code(&q), 1);
    assert_eq!(code(&c), 1);
    assert!(
        String::from_utf8_lossy(&c.stderr).contains("Compression not supported"),
        "{c:?}"
    );
}

/// resize --shrink of qcow2 images: same result as qemu-img's shrink
/// (contents, allocated clusters, clean check) for several shapes; the
/// cut-off tail of the last kept cluster reads as zeroes if the image is
/// grown again (qemu-img 7.2 brings the old bytes back); with a snapshot,
/// the snapshot still reads all its data after the shrink.
#[test]
fn resize_shrink_matches_qemu_img() {
    let dir = TempDir::new("cli");
    for opts in [
        "cluster_size=65536",
        "cluster_size=4096",
        "cluster_size=65536,extended_l2=on",
        "cluster_size=512,compat=0.10",
    ] {
        let theirs = dir.file("theirs.qcow2");
        let ours = dir.file("ours.qcow2");
        for img in [&theirs, &ours] {
            qemu_img(&["create", "-q", "-f", "qcow2", "-o", opts, img, "8M"]);
            qemu_io(
                "qcow2",
                img,
                &[
                    "write -P 0x11 0 3M",
                    "write -P 0x22 5M 2M",
                    "write -c -P 0x33 7M 64k",
                    "write -z 2M 64k",
                ],
            );
        }
        qemu_img(&["resize", "-q", "--shrink", &theirs, "2621952"]);
        ch(&["resize", "-q", "--shrink", &ours, "2621952"]);
        qemu_img(&["check", &ours]);
        qemu_img(&["compare", &theirs, &ours]);
        let count = |img: &str| {
            json(&qemu_img(&["check", "--output=json", img]))["allocated-clusters"].clone()
        };
        assert_eq!(count(&theirs), count(&ours), "{opts}");
        ch(&["resize", "-q", &ours, "3M"]);
        qemu_img(&["check", &ours]);
        // qemu_io fails the test on a pattern mismatch.
        qemu_io("qcow2", &ours, &["read -P 0 2621952 523776"]);
    }
    // With a snapshot: the shared tables and the shared last cluster are
    // copied for the active disk, so the snapshot keeps all its data.
    let theirs = sample_qcow2(&dir, "snap-theirs.qcow2");
    let ours = sample_qcow2(&dir, "snap-ours.qcow2");
    for img in [&theirs, &ours] {
        qemu_img(&["snapshot", "-c", "s", img]);
    }
    qemu_img(&["resize", "-q", "--shrink", &theirs, "66048"]);
    ch(&["resize", "-q", "--shrink", &ours, "66048"]);
    qemu_img(&["check", &ours]);
    qemu_img(&["compare", &theirs, &ours]);
    ch(&["resize", "-q", &ours, "2M"]);
    qemu_io(
        "qcow2",
        &ours,
        &["read -P 0xab 0 66048", "read -P 0 66048 2031104"],
    );
    for img in [&theirs, &ours] {
        qemu_img(&["snapshot", "-a", "s", img]);
    }
    qemu_img(&["check", &ours]);
    qemu_img(&["compare", &theirs, &ours]);
    qemu_img(&[
        "compare",
        &theirs,
        &sample_qcow2(&dir, "snap-original.qcow2"),
    ]);
}

#[test]
fn resize_grows_and_refuses_to_shrink() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "s.qcow2");
    assert_eq!(ch(&["resize", &img, "+1M"]), "Image resized.\n");
    let info = json(&qemu_img(&["info", "--output=json", &img]));
    assert_eq!(info["virtual-size"], 17 << 20);
    qemu_img(&["check", &img]);
    assert_eq!(code(&ch_status(&["resize", &img, "1M"])), 1);
    assert_eq!(code(&ch_status(&["resize", &img, "-1M"])), 1);
    let raw = dir.file("r.raw");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "1M"]);
    ch(&["resize", "-f", "raw", &raw, "3M"]);
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 3 << 20);
}

#[test]
fn bench_writes_the_pattern_and_reports_json() {
    let dir = TempDir::new("cli");
    let img = dir.file("b.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "4M"]);
    let out = ch(&[
        "bench",
        "-w",
        "-c",
        "512",
        "-d",
        "8",
        "-s",
        "8k",
        "--pattern=7",
        "--flush-interval=64",
        &img,
    ]);
    assert!(out.starts_with("Sending 512 write requests, 8192 bytes each, 8 in parallel (starting at offset 0, step size 8192)\nSending flush every 64 requests\nRun completed in "), "{out}");
    qemu_img(&["check", &img]);
    // 512 x 8 KiB = the whole 4 MiB disk, every byte the pattern.
    qemu_io("qcow2", &img, &["read -P 7 0 4M"]);
    let j = json(&ch(&[
        "bench",
        "-c",
        "300",
        "-d",
        "4",
        "--random",
        "--seed",
        "9",
        "--rw-mix=50",
        "--output=json",
        &img,
    ]));
    for key in ["ops_per_sec", "mib_per_sec", "lat_mean_us", "lat_p99_us"] {
        assert!(j[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {j}");
    }
    assert_eq!(j["requests"], 300);
    qemu_img(&["check", &img]);
}

#[test]
fn bench_refuses_what_qemu_img_refuses() {
    let dir = TempDir::new("cli");
    let img = dir.file("b.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "4M"]);
    for args in [
        vec![
            "bench",
            "-w",
            "-c",
            "10",
            "--flush-interval=10",
            img.as_str(),
        ],
        vec!["bench", "-c", "10", "-n", img.as_str()],
        vec!["bench", "-c", "10", "-i", "bogus", img.as_str()],
        vec!["bench", "-c", "10", "-d", "0", img.as_str()],
    ] {
        assert_eq!(
            code(&qemu_img_status_or_skip_hang(&args)),
            1,
            "qemu-img {args:?}"
        );
        assert_eq!(code(&ch_status(&args[..])), 1, "ch-img {args:?}");
    }
}

/// qemu-img bench -d 0 never returns; ch-img refuses it. Only ask qemu-img
/// the other questions.
fn qemu_img_status_or_skip_hang(args: &[&str]) -> std::process::Output {
    if args.windows(2).any(|w| w == ["-d", "0"]) {
        return ch_status(args);
    }
    qemu_img_status(args)
}

#[test]
fn check_of_an_image_that_cannot_be_opened_exits_1() {
    let dir = TempDir::new("cli");
    let img = sample_qcow2(&dir, "t.qcow2");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(50)
        .unwrap();
    assert_eq!(code(&qemu_img_status(&["check", &img])), 1);
    let c = ch_status(&["check", &img]);
    assert_eq!(code(&c), 1);
    assert!(String::from_utf8_lossy(&c.stderr).contains("truncated header"));
}

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

/// `info` lists persistent bitmaps as qemu-img does: flags (in-use, auto),
/// name, granularity, in both output formats; a disabled bitmap has no
/// flags (qemu prints an empty list). After ch-img opened the image
/// read-write (it does not maintain bitmaps, so it clears their autoclear
/// bit), neither tool lists them.
#[test]
fn info_lists_persistent_bitmaps_like_qemu_img() {
    let dir = TempDir::new("cli");
    let img = dir.file("bitmaps.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "64M"]);
    qemu_img(&["bitmap", "--add", &img, "b1"]);
    qemu_img(&["bitmap", "--add", "-g", "512", &img, "second one"]);
    qemu_img(&["bitmap", "--disable", &img, "second one"]);
    // A bitmap left in use: qemu-io marks the enabled bitmap in-use when it
    // opens the image read-write, and is killed before it can clear that.
    let mut io = std::process::Command::new("qemu-io")
        .args(["-c", "write 0 4k", "-c", "sleep 30000", &img])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !qemu_img(&["info", "-U", &img]).contains("in-use") {
        assert!(
            std::time::Instant::now() < deadline,
            "qemu-io never marked b1 in-use"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    io.kill().unwrap();
    io.wait().unwrap();
    let human = qemu_img(&["info", &img]);
    assert!(
        human.contains("[0]: in-use\n                [1]: auto"),
        "{human}"
    );
    assert!(human.contains("name: second one\n            granularity: 512"));
    for out in ["--output=human", "--output=json"] {
        assert_eq!(
            qemu_img(&["info", out, &img]),
            ch(&["info", out, &img]),
            "{out}"
        );
    }
    ch(&["resize", &img, "+1M"]);
    for out in ["--output=human", "--output=json"] {
        let q = qemu_img(&["info", out, &img]);
        assert!(!q.contains("bitmaps:") && !q.contains("\"bitmaps\""), "{q}");
        assert_eq!(q, ch(&["info", out, &img]), "{out} after a read-write open");
    }
}

/// Snapshots and disk sizes, beside qemu-img 7.2 doing the same steps on
/// a twin image: `resize` grows an image that has snapshots, and
/// `snapshot -a` of a snapshot taken at another size brings that size
/// back (smaller and larger), also after the disk was shrunk with the
/// snapshots present. After each step both images have the same virtual
/// size and contents, and both check clean. A version 2 image with
/// snapshots is not resized at all, as by qemu-img.
#[test]
fn snapshot_apply_restores_its_disk_size_like_qemu_img() {
    let dir = TempDir::new("cli");
    let theirs = dir.file("theirs.qcow2");
    let ours = dir.file("ours.qcow2");
    for img in [&theirs, &ours] {
        qemu_img(&["create", "-q", "-f", "qcow2", img, "4M"]);
        qemu_io("qcow2", img, &["write -P 0x11 0 4M"]);
    }
    let same = |step: &str| {
        let size =
            |img: &str| json(&qemu_img(&["info", "--output=json", img]))["virtual-size"].clone();
        assert_eq!(size(&theirs), size(&ours), "{step}");
        qemu_img(&["check", &ours]);
        qemu_img(&["compare", &theirs, &ours]);
    };
    qemu_img(&["snapshot", "-c", "small", &theirs]);
    ch(&["snapshot", "-c", "small", &ours]);
    qemu_img(&["resize", "-q", &theirs, "8M"]);
    ch(&["resize", "-q", &ours, "8M"]);
    same("grown with a snapshot");
    for img in [&theirs, &ours] {
        qemu_io(
            "qcow2",
            img,
            &["write -P 0x22 4M 4M", "write -P 0x33 0 64k"],
        );
    }
    qemu_img(&["snapshot", "-c", "large", &theirs]);
    ch(&["snapshot", "-c", "large", &ours]);
    qemu_img(&["snapshot", "-a", "small", &theirs]);
    ch(&["snapshot", "-a", "small", &ours]);
    same("applied the 4 MiB snapshot");
    qemu_io("qcow2", &ours, &["read -P 0x11 0 4M"]);
    qemu_img(&["snapshot", "-a", "large", &theirs]);
    ch(&["snapshot", "-a", "large", &ours]);
    same("applied the 8 MiB snapshot");
    qemu_io(
        "qcow2",
        &ours,
        &["read -P 0x33 0 64k", "read -P 0x22 4M 4M"],
    );
    // Back to 4 MiB, then grown again: the old tail is not mapped.
    qemu_img(&["snapshot", "-a", "small", &theirs]);
    ch(&["snapshot", "-a", "small", &ours]);
    qemu_img(&["resize", "-q", &theirs, "6M"]);
    ch(&["resize", "-q", &ours, "6M"]);
    same("applied the 4 MiB snapshot and grew to 6 MiB");
    qemu_io("qcow2", &ours, &["read -P 0 4M 2M"]);
    // Shrunk with both snapshots present, then each applied again.
    qemu_img(&["resize", "-q", "--shrink", &theirs, "2M"]);
    ch(&["resize", "-q", "--shrink", &ours, "2M"]);
    same("shrunk to 2 MiB with snapshots");
    for (sn, step) in [
        ("large", "the 8 MiB snapshot after the shrink"),
        ("small", "the 4 MiB one"),
    ] {
        qemu_img(&["snapshot", "-a", sn, &theirs]);
        ch(&["snapshot", "-a", sn, &ours]);
        same(step);
    }
    qemu_io("qcow2", &ours, &["read -P 0x11 0 4M"]);
    // A version 2 image with snapshots is not resized (qemu-img: "Can't
    // resize a v2 image which has snapshots").
    let v2 = dir.file("v2.qcow2");
    qemu_create_qcow2(&v2, "compat=0.10", "4M");
    qemu_img(&["snapshot", "-c", "s", &v2]);
    assert_eq!(code(&ch_status(&["resize", &v2, "8M"])), 1);
    let info = json(&qemu_img(&["info", "--output=json", &v2]));
    assert_eq!(info["virtual-size"], 4 << 20);
}

/// commit -b into a deeper base, beside qemu-img on a twin chain (base <-
/// mid <- top, the mid image smaller than the top): the base ends up
/// reading as the top did, the top keeps its data (-b implies -d, also
/// for the direct backing file), and the layouts match qemu-img's. A base
/// not in the chain is refused with qemu-img's message.
#[test]
fn commit_into_a_deeper_base_matches_qemu_img() {
    let dir = TempDir::new("cli");
    let mut made = Vec::new();
    for tool in ["theirs", "ours"] {
        let base = dir.file(&format!("base-{tool}.qcow2"));
        let mid = dir.file(&format!("mid-{tool}.qcow2"));
        let top = dir.file(&format!("top-{tool}.qcow2"));
        qemu_create_qcow2(&base, "cluster_size=65536", "4M");
        qemu_io("qcow2", &base, &["write -P 0x11 0 4M"]);
        let backed = |img: &str, backing: &str, size: &str| {
            let b = format!("backing_file={backing},backing_fmt=qcow2");
            qemu_create_qcow2(img, &b, size);
        };
        backed(&mid, &format!("base-{tool}.qcow2"), "3M");
        qemu_io("qcow2", &mid, &["write -P 0x22 1M 512k", "write -z 2M 64k"]);
        backed(&top, &format!("mid-{tool}.qcow2"), "4M");
        qemu_io(
            "qcow2",
            &top,
            &["write -P 0x33 1536k 1M", "write -P 0x44 3840k 64k"],
        );
        let before = dir.file(&format!("before-{tool}.raw"));
        qemu_img(&["convert", "-O", "raw", &top, &before]);
        let base_name = format!("base-{tool}.qcow2");
        let args = ["commit", "-b", base_name.as_str(), top.as_str()];
        let out = if tool == "theirs" {
            qemu_img(&args)
        } else {
            ch(&args)
        };
        assert_eq!(out, "Image committed.\n");
        for img in [&base, &mid, &top] {
            qemu_img(&["check", img]);
        }
        qemu_img(&["compare", "-F", "raw", &base, &before]);
        qemu_img(&["compare", "-F", "raw", &top, &before]);
        made.push((base, top));
    }
    assert_eq!(layout(&made[0].1), layout(&made[1].1), "top");
    qemu_img(&["compare", &made[0].0, &made[1].0]);
    // -b naming the direct backing file keeps the top's data too.
    qemu_img(&["commit", "-q", "-b", "mid-theirs.qcow2", &made[0].1]);
    let top = &made[1].1;
    ch(&["commit", "-q", "-b", "mid-ours.qcow2", top]);
    assert_eq!(layout(&made[0].1), layout(top), "top after -b mid");
    qemu_img(&["compare", &made[0].1, top]);
    let c = ch_status(&["commit", "-b", "nothere.qcow2", top]);
    assert_eq!(code(&c), 1);
    assert!(
        String::from_utf8_lossy(&c.stderr)
            .contains("Did not find 'nothere.qcow2' in the backing chain"),
        "{}",
        String::from_utf8_lossy(&c.stderr)
    );
}

/// resize growing an overlay whose backing file is longer: the new area
/// reads zeroes, not the backing file's bytes, as after qemu-img's resize
/// (which zeroes it too); also from an old size inside a cluster, and for
/// a v2 overlay (no zero clusters: zeroes are written; qemu-img 7.2 fails
/// there instead).
#[test]
fn resize_grows_an_overlay_to_zeroes_over_a_longer_backing_file() {
    let dir = TempDir::new("cli");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "4M"]);
    qemu_io("qcow2", &base, &["write -P 0x77 0 4M"]);
    for (opts, old) in [("", "1M"), ("", "1049088"), ("compat=0.10", "1M")] {
        let mut made = Vec::new();
        for tool in ["theirs", "ours"] {
            let top = dir.file(&format!("top-{tool}.qcow2"));
            let o = format!(
                "backing_file=base.qcow2,backing_fmt=qcow2{}{opts}",
                if opts.is_empty() { "" } else { "," }
            );
            qemu_create_qcow2(&top, &o, old);
            let args = ["resize", "-q", top.as_str(), "6M"];
            if tool == "ours" {
                ch(&args);
            } else if opts.is_empty() {
                qemu_img(&args);
            } else {
                // qemu-img 7.2 cannot zero the new area of a v2 overlay
                // ("Failed to zero out new clusters") and fails; we write
                // the zeroes. Compare against a raw picture instead.
                assert!(!qemu_img_status(&args).status.success());
                qemu_img(&["create", "-q", "-f", "raw", &top, "6M"]);
                qemu_io("raw", &top, &[&format!("write -P 0x77 0 {old}")]);
            }
            if tool == "ours" || opts.is_empty() {
                qemu_img(&["check", &top]);
            }
            made.push(top);
        }
        let ours = &made[1];
        qemu_io("qcow2", ours, &[&format!("read -P 0x77 0 {old}")]);
        let old_n: u64 = if old == "1M" {
            1 << 20
        } else {
            old.parse().unwrap()
        };
        qemu_io(
            "qcow2",
            ours,
            &[&format!("read -P 0 {old_n} {}", (6 << 20) - old_n)],
        );
        qemu_img(&["compare", &made[0], ours]);
        // Past the backing file's end nothing shows through, and we leave
        // those clusters unallocated where qemu-img marks them zero.
        let zero_to_backing_end = json(&qemu_img(&["map", "--output=json", ours]))
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["depth"] == 0 && e["zero"] == true)
            .map(|e| e["start"].as_u64().unwrap() + e["length"].as_u64().unwrap())
            .max();
        assert!(zero_to_backing_end >= Some(4 << 20), "{opts} {old}");
    }
}
