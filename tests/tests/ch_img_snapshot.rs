//! `ch-img snapshot` against `qemu-img snapshot` 7.2: listings, snapshots
//! that hold the disk as it was whoever writes after, applying and
//! deleting them (with qemu-img on the same image), disk sizes that
//! change between snapshots, and refusals that change nothing.

mod ch_img_support;

use ch_img_support::{code, sample_qcow2};
use integration_tests::{ch, ch_status, json, qemu_create_qcow2, qemu_img, qemu_io, TempDir};

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
