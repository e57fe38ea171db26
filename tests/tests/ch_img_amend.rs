//! `ch-img amend` against `qemu-img amend` 7.2 on copies of the same
//! images: the same output (progress included), exit status and refusal
//! messages, and an amended image qemu-img reads the same way (`info`,
//! `check` clean, `compare` equal; bitmaps read back over NBD).

mod ch_img_support;

use ch_img_support::{assert_clean, ch_run, dirty_map, info_facts, qemu_run, Run, Tool};
use integration_tests::{qemu_img, qemu_io, TempDir};

/// Runs `amend ARGS` on a copy of `base` with each tool; returns both
/// runs and the two copies.
fn both(dir: &TempDir, base: &str, args: &[&str]) -> (Run, Run, String, String) {
    let (q, c) = (dir.file("q.qcow2"), dir.file("c.qcow2"));
    std::fs::copy(base, &q).unwrap();
    std::fs::copy(base, &c).unwrap();
    let run = |tool: Tool, img: &str| {
        let mut argv = vec!["amend"];
        argv.extend_from_slice(args);
        argv.push(img);
        tool(&argv, &[(img, "IMG")])
    };
    (run(qemu_run, &q), run(ch_run, &c), q, c)
}

/// Asserts both tools print the same, exit the same and leave images
/// qemu-img sees the same way (ours clean).
fn assert_same_amend(dir: &TempDir, base: &str, args: &[&str]) -> Run {
    let (q, c, qi, ci) = both(dir, base, args);
    assert_eq!(q, c, "amend {args:?}");
    assert_eq!(info_facts(&qi), info_facts(&ci), "amend {args:?}");
    assert_clean(&ci);
    qemu_img(&["compare", &qi, &ci]);
    c
}

fn image(dir: &TempDir, name: &str, opts: &str, size: &str, io: &[&str]) -> String {
    let img = dir.file(name);
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", opts, &img, size]);
    if !io.is_empty() {
        qemu_io("qcow2", &img, io);
    }
    img
}

const DATA: &[&str] = &[
    "write -P 1 0 1M",
    "write -z 2M 128k",
    "write -P 2 5M 64k",
    "write -z 5M 4k",
];

#[test]
fn amend_matches_qemu_img() {
    let dir = TempDir::new("amend");
    let v3 = image(&dir, "v3.qcow2", "compat=1.1", "64M", DATA);
    for o in [
        "compat=0.10",
        "compat=v2",
        "compat=1.1",
        "lazy_refcounts=on",
        "refcount_bits=64",
        "refcount_bits=1",
        "refcount_bits=8,lazy_refcounts=on",
        "refcount_bits=16,compat=0.10",
        "size=128M",
        "size=32M",
        "compat=v2,size=128M",
        "data_file_raw=off",
        "compat=0.10,compat=1.1",
    ] {
        let c = assert_same_amend(&dir, &v3, &["-o", o]);
        assert_eq!(c.code, 0, "{o}: {c:?}");
    }
    // The progress report: the same digits, a refcount width change
    // included (qemu-img counts it in walks over the refcount table).
    for o in [
        "compat=0.10",
        "lazy_refcounts=on",
        "size=128M",
        "refcount_bits=64",
        "refcount_bits=1",
        "refcount_bits=8,lazy_refcounts=on",
    ] {
        assert_same_amend(&dir, &v3, &["-p", "-o", o]);
    }
    // A version 2 image with an internal snapshot.
    let v2 = image(&dir, "v2.qcow2", "compat=0.10", "64M", &["write -P 1 0 1M"]);
    qemu_img(&["snapshot", "-c", "s1", &v2]);
    for args in [
        &["-o", "compat=1.1"][..],
        &["-p", "-o", "compat=1.1"],
        &["-o", "compat=1.1,lazy_refcounts=on"],
        &["-o", "compat=1.1,size=128M"],
        &["-o", "compat=1.1,size=32M"],
        &["-o", "compat=1.1,refcount_bits=64"],
    ] {
        assert_eq!(assert_same_amend(&dir, &v2, args).code, 0, "{args:?}");
    }
}

#[test]
fn downgrade_expands_zero_clusters_like_qemu_img() {
    let dir = TempDir::new("amend");
    let backing = image(&dir, "b.qcow2", "compat=1.1", "4M", &["write -P 7 0 4M"]);
    let top = dir.file("top.qcow2");
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", "b.qcow2", "-F", "qcow2", &top,
    ]);
    qemu_io("qcow2", &top, &["write -z 0 64k", "write -P 3 64k 64k"]);
    qemu_img(&["snapshot", "-c", "s1", &top]);
    qemu_io("qcow2", &top, &["write -z 128k 128k", "write -z 1M 4k"]);
    for args in [&["-o", "compat=0.10"][..], &["-p", "-o", "compat=0.10"]] {
        assert_same_amend(&dir, &top, args);
    }
    let (_, c, qi, ci) = both(&dir, &top, &["-o", "compat=0.10"]);
    assert_eq!(c.code, 0);
    // Both snapshots' trees read as before, in both images.
    for img in [&qi, &ci] {
        qemu_img(&["snapshot", "-a", "s1", img]);
        qemu_io(
            "qcow2",
            img,
            &["read -P 0 0 64k", "read -P 3 64k 64k", "read -P 7 128k 64k"],
        );
    }
    qemu_img(&["compare", &qi, &ci]);
    assert_clean(&ci);
    drop(backing);
}

#[test]
fn amend_refuses_what_qemu_img_refuses() {
    let dir = TempDir::new("amend");
    let v3 = image(&dir, "v3.qcow2", "compat=1.1", "64M", DATA);
    qemu_img(&["snapshot", "-c", "s1", &v3]);
    let v2 = image(&dir, "v2.qcow2", "compat=0.10", "64M", &[]);
    let extl2 = image(&dir, "e.qcow2", "extended_l2=on", "1M", &[]);
    let zstd = image(
        &dir,
        "z.qcow2",
        "compression_type=zstd",
        "1M",
        &["write -c 0 64k"],
    );
    let cases: Vec<(&String, Vec<&str>)> = vec![
        (&v3, vec!["-o", "refcount_bits=1"]),
        (&v3, vec!["-o", "refcount_bits=3"]),
        (&v3, vec!["-o", "refcount_bits=x"]),
        (&v3, vec!["-o", "size=abc"]),
        (&v3, vec!["-o", "lazy_refcounts=maybe"]),
        (&v3, vec!["-o", "data_file=x"]),
        (&v3, vec!["-o", "data_file_raw=on"]),
        (&v3, vec!["-o", "backing_file=x"]),
        (&v3, vec!["-p", "-o", "backing_file=x"]),
        (&v3, vec!["-o", "cluster_size=4k"]),
        (&v3, vec!["-o", "foo=1"]),
        (&v3, vec!["-o", "compat=0.9"]),
        (&v3, vec!["-p", "-o", "compat=0.9"]),
        (&v3, vec!["-o", "compat=0.10,lazy_refcounts=on"]),
        (&v3, vec!["-o", "compat=0.10,size=128M"]),
        (&v3, vec!["-o", "refcount_bits=64,compat=0.10"]),
        (&v3, vec!["-o", "refcount_bits=8,compat=0.10"]),
        (&v3, vec!["-o", "encrypt.keyslot=1"]),
        (&v3, vec![]),
        (&v3, vec!["-U", "-o", "compat=1.1"]),
        (&v3, vec!["-t", "bogus", "-o", "compat=1.1"]),
        (&v3, vec!["-f", "raw", "-o", "compat=0.10"]),
        (&v2, vec!["-o", "lazy_refcounts=on"]),
        (&v2, vec!["-o", "refcount_bits=32"]),
        (&extl2, vec!["-o", "compat=0.10"]),
        (&zstd, vec!["-o", "compat=0.10"]),
    ];
    for (img, args) in cases {
        let keep = std::fs::read(img).unwrap();
        let (q, c, _, ci) = both(&dir, img, &args);
        assert_eq!(q, c, "amend {args:?}");
        assert_eq!(c.code, 1, "amend {args:?}");
        // Unlike qemu-img (which may stop half way), nothing changed.
        assert!(
            std::fs::read(&ci).unwrap() == keep,
            "amend {args:?} changed the image"
        );
    }
    // Two file names, or none.
    let two = ["amend", "-o", "compat=1.1", v3.as_str(), v2.as_str()];
    assert_eq!(qemu_run(&two, &[]), ch_run(&two, &[]));
}

/// A zstd image without compressed clusters goes to version 2 with zlib.
#[test]
fn downgrade_of_zstd_and_lazy_images() {
    let dir = TempDir::new("amend");
    let zstd = image(
        &dir,
        "z.qcow2",
        "compression_type=zstd",
        "1M",
        &["write -P 1 0 64k"],
    );
    assert_same_amend(&dir, &zstd, &["-o", "compat=0.10"]);
    let lazy = image(
        &dir,
        "l.qcow2",
        "lazy_refcounts=on",
        "1M",
        &["write -P 1 0 64k"],
    );
    assert_same_amend(&dir, &lazy, &["-o", "compat=0.10"]);
    assert_same_amend(&dir, &lazy, &["-o", "lazy_refcounts=off"]);
}

#[test]
fn bitmaps_survive_what_qemu_img_keeps_them_through() {
    if !testkit::has_command("nbdinfo") || !testkit::has_command("qemu-nbd") {
        return;
    }
    let dir = TempDir::new("amend");
    let img = image(&dir, "bm.qcow2", "compat=1.1", "64M", &[]);
    qemu_img(&["bitmap", "--add", &img, "b0"]);
    qemu_io("qcow2", &img, &["write 0 64k", "write 1M 200k"]);
    qemu_img(&["bitmap", "--add", "-g", "1M", "--disable", &img, "b1"]);
    let before = dirty_map(&img, "b0");
    assert!(before.contains("dirty"), "{before}");
    for o in ["refcount_bits=64", "lazy_refcounts=on", "refcount_bits=2"] {
        let (_, c, _, ci) = both(&dir, &img, &["-o", o]);
        assert_eq!(c.code, 0, "{o}: {c:?}");
        assert_eq!(dirty_map(&ci, "b0"), before, "{o}");
        assert_eq!(
            info_facts(&ci)["format-specific"]["data"]["bitmaps"],
            info_facts(&img)["format-specific"]["data"]["bitmaps"],
            "{o}"
        );
        assert_clean(&ci);
    }
    // A downgrade drops them (qemu-img leaves their clusters leaked; we
    // free them).
    let (q, c, _, ci) = both(&dir, &img, &["-o", "compat=0.10"]);
    assert_eq!((q.code, c.code), (0, 0));
    assert_clean(&ci);
}

/// A refcount width change copies every refcount: `-p` moves at every
/// percent on a large image, digit for digit as qemu-img's.
#[test]
fn refcount_width_progress_moves_at_every_percent() {
    let dir = TempDir::new("amend-p");
    let big = image(
        &dir,
        "big.qcow2",
        "compat=1.1",
        "2G",
        &["write -P 1 0 64M", "write -z 1G 64M"],
    );
    for o in ["refcount_bits=64", "refcount_bits=1"] {
        let c = assert_same_amend(&dir, &big, &["-p", "-o", o]);
        let reports = c.stdout.matches("/100%)").count();
        assert!(reports > 100, "{o}: {reports} reports: {:?}", c.stdout);
    }
}
