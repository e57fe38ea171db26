//! `ch-img map` against `qemu-img map` 7.2: the same table and JSON, with
//! and without a range, and the same failure for compressed clusters in
//! the table.

mod ch_img_support;

use ch_img_support::{code, sample_qcow2, stdout};
use integration_tests::{
    ch, ch_status, qemu_create_overlay, qemu_img, qemu_img_status, qemu_io, TempDir,
};

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
