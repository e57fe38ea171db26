//! `ch-img info` against `qemu-img info` 7.2: the same text and JSON for
//! raw and qcow2 images of every kind, backing chains
//! (`--backing-chain`) and persistent bitmaps.

mod ch_img_support;

use ch_img_support::sample_qcow2;
use integration_tests::{ch, qemu_create_overlay, qemu_create_qcow2, qemu_img, qemu_io, TempDir};

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
