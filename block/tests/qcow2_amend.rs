//! `Amendable::amend` on qcow2 images made by qemu-img, with a fault
//! (EIO, ENOSPC, a failed fdatasync) injected at every metadata write and
//! sync it makes in turn: a failed amend leaves the image as it was
//! (`qemu-img info` the same, `qemu-img check` clean without leaks, the
//! same contents), and once no fault fires the amend completes and
//! qemu-img reads the amended image back.

mod support;

use std::path::Path;
use std::sync::Arc;

use block::formats::qcow2::metadata::meta_faults::{FaultyMetaIo, MetaFault};
use block::formats::qcow2::metadata::meta_io::MetaIo;
use block::formats::qcow2::{open_qcow2, Qcow2Image};
use block::formats::{Amendable, Amendment, Format};
use block::DiskOptions;
use support::*;

/// `qemu-img info` without the lines that name the file or follow the
/// layout (`image:`, `disk size:`).
fn facts(p: &Path) -> String {
    run("qemu-img", &["info", s(p)])
        .lines()
        .filter(|l| !l.starts_with("image:") && !l.starts_with("disk size:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of `key: ` in `qemu-img info`'s format specific lines.
fn fact(p: &Path, key: &str) -> String {
    facts(p)
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}: ")).map(String::from))
        .unwrap_or_else(|| panic!("no {key} in qemu-img info"))
}

fn open_rw(p: &Path) -> Arc<Qcow2Image> {
    let mut o = DiskOptions::new(p);
    o.lock = false;
    o.keep_persistent_bitmaps = true;
    let file = block::formats::open::open_file(&o).unwrap();
    Arc::new(open_qcow2(&o, file, &block::formats::FORMATS).unwrap())
}

/// Runs `amendment` on a copy of `base` with `fault` armed; returns
/// whether the fault fired (the amend must then have failed) and the copy.
fn amend_with(
    dir: &TempDir,
    base: &Path,
    amendment: &Amendment,
    fault: MetaFault,
) -> (bool, std::path::PathBuf) {
    // Beside the original, so a relative backing file name still resolves.
    let _ = dir;
    let work = base.with_file_name("work.qcow2");
    std::fs::copy(base, &work).unwrap();
    let img = open_rw(&work);
    let mut armed = None;
    img.wrap_meta_io(|inner| {
        let f = Arc::new(FaultyMetaIo::new(inner, &[fault]));
        armed = Some(Arc::clone(&f));
        f as Arc<dyn MetaIo>
    });
    let result = img.amend(amendment, &mut |_, _, _| {});
    let fired = armed.unwrap().stats().fired > 0;
    match (&result, fired) {
        (Err(_), true) => drop(img),
        (Ok(()), false) => img.close().unwrap(),
        (r, fired) => panic!("{amendment:?} {fault:?}: {r:?} although the fault fired: {fired}"),
    }
    (fired, work)
}

/// Every fault position in turn, for each kind of fault.
fn amend_fails_cleanly(base: &Path, amendment: &Amendment, check_done: impl Fn(&Path)) {
    let dir = temp_dir("amend-faults");
    let before = facts(base);
    let faults: [fn(u64) -> MetaFault; 3] = [
        |n| MetaFault::fail_write(None, n, libc::EIO),
        |n| MetaFault::fail_write(None, n, libc::ENOSPC),
        |n| MetaFault::fail_sync(n, libc::EIO),
    ];
    for fault in faults {
        let mut n = 1;
        loop {
            let (fired, work) = amend_with(&dir, base, amendment, fault(n));
            let what = format!("{amendment:?} with {:?}", fault(n));
            if !fired {
                eprintln!("{amendment:?}: completes after {} failed tries", n - 1);
                assert!(n > 1, "{what}: no fault fired at all");
                qemu_check(&work);
                qemu_compare(base, &work);
                check_done(&work);
                break;
            }
            assert_eq!(facts(&work), before, "{what}: the image changed");
            qemu_check(&work);
            qemu_compare(base, &work);
            n += 1;
            assert!(n < 400, "{what}: the amend never completes");
        }
    }
}

fn compat(p: &Path) -> String {
    fact(p, "compat")
}

/// A 4 MiB image over a backing file: data, zero clusters with and
/// without a host cluster, and a snapshot that shares some of them.
fn sample(dir: &TempDir) -> std::path::PathBuf {
    let base = dir.join("backing.qcow2");
    qemu_create("qcow2", s(&base), "4M", "");
    qemu_io("qcow2", &base, &["write -P 7 0 4M"]);
    let img = dir.join("img.qcow2");
    qemu_create_overlay("qcow2", s(&img), None, "", "backing.qcow2", "qcow2");
    qemu_io("qcow2", &img, &["write -z 0 64k", "write -P 3 64k 64k"]);
    run("qemu-img", &["snapshot", "-c", "s1", s(&img)]);
    qemu_io(
        "qcow2",
        &img,
        &["write -z 128k 64k", "write -P 4 1M 64k", "write -z 1M 64k"],
    );
    img
}

#[test]
fn downgrade_fails_cleanly_or_completes() {
    let dir = temp_dir("amend-down");
    let img = sample(&dir);
    let a = Amendment {
        version: Some(2),
        ..Default::default()
    };
    amend_fails_cleanly(&img, &a, |done| {
        assert_eq!(compat(done), "0.10");
        // The snapshot still reads as it did.
        run("qemu-img", &["snapshot", "-a", "s1", s(done)]);
        qemu_check(done);
    });
}

#[test]
fn refcount_width_change_fails_cleanly_or_completes() {
    let dir = temp_dir("amend-rc");
    let img = sample(&dir);
    for bits in [64, 2] {
        let a = Amendment {
            refcount_bits: Some(bits),
            lazy_refcounts: Some(true),
            ..Default::default()
        };
        amend_fails_cleanly(&img, &a, |done| {
            assert_eq!(fact(done, "refcount bits"), bits.to_string());
            assert_eq!(fact(done, "lazy refcounts"), "true");
        });
    }
}

#[test]
fn upgrade_fails_cleanly_or_completes() {
    let dir = temp_dir("amend-up");
    let img = dir.join("v2.qcow2");
    qemu_create("qcow2", s(&img), "8M", "compat=0.10,cluster_size=4096");
    qemu_io("qcow2", &img, &["write -P 9 0 100k"]);
    run("qemu-img", &["snapshot", "-c", "s1", s(&img)]);
    let a = Amendment {
        version: Some(3),
        refcount_bits: Some(8),
        ..Default::default()
    };
    amend_fails_cleanly(&img, &a, |done| {
        assert_eq!(compat(done), "1.1");
        run("qemu-img", &["snapshot", "-a", "s1", s(done)]);
        qemu_check(done);
    });
}

#[test]
fn refusals_change_nothing() {
    let dir = temp_dir("amend-refused");
    let img = sample(&dir);
    let keep = std::fs::read(&img).unwrap();
    let image = open_rw(&img);
    for (a, message) in [
        (
            Amendment {
                refcount_bits: Some(1),
                ..Default::default()
            },
            "Cannot decrease refcount entry width to 1 bits: Cluster at offset",
        ),
        (
            Amendment {
                version: Some(2),
                size: Some(8 << 20),
                ..Default::default()
            },
            "Internal snapshots prevent downgrade of image",
        ),
        (
            Amendment {
                backing: Some((Some("other".into()), None)),
                ..Default::default()
            },
            "Cannot amend the backing file",
        ),
        (
            Amendment {
                version: Some(2),
                lazy_refcounts: Some(true),
                ..Default::default()
            },
            "Lazy refcounts only supported with compatibility level 1.1",
        ),
    ] {
        let e = image.amend(&a, &mut |_, _, _| {}).unwrap_err();
        assert!(e.to_string().starts_with(message), "{a:?}: {e}");
    }
    image.close().unwrap();
    drop(image);
    assert!(
        std::fs::read(&img).unwrap() == keep,
        "a refused amend changed the file"
    );
}
