//! `ch-img check` against `qemu-img check` 7.2: reports (text and JSON)
//! and exit statuses of clean, leaking, corrupt, raw and unopenable
//! images, and repairs qemu-img then finds clean.

mod ch_img_support;

use std::os::unix::fs::FileExt;

use ch_img_support::{code, sample_qcow2, stdout};
use integration_tests::{ch_status, json, qemu_img, qemu_img_status, TempDir};

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
