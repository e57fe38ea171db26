//! `ch-img create` against `qemu-img create` 7.2: the "Formatting" line,
//! the image qemu-img reads back (format, size, format-specific
//! options, a clean check), backing files and their size, zero-size
//! images, and the command lines both refuse.

mod ch_img_support;

use ch_img_support::{code, sample_qcow2};
use integration_tests::{ch, ch_status, json, qemu_img, qemu_img_status, qemu_io, TempDir};

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
