//! Issue 27, deliverable 4: broken backing chains can be looked at and
//! repaired. `info` opens an image without its backing files (as
//! qemu-img does), so an overlay whose backing file is missing, or a
//! chain that loops, shows with its `backing file:` line, and
//! `--backing-chain` prints qemu-img's error where the chain breaks;
//! `rebase -u` rewrites the header without opening the old backing file;
//! `create -u` records a backing file it does not open (the size must
//! then be given). Every output and exit status is qemu-img 7.2's.

mod img_safety_support;

use img_safety_support::*;
use integration_tests::{qemu_img, TempDir};

/// sub/top.qcow2 over sub/base.qcow2 (moved away to sub/moved.qcow2),
/// top2.qcow2 over sub/top.qcow2, and L1.qcow2 <-> L2.qcow2 (a loop).
fn broken(dir: &TempDir) {
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let create = |args: &[&str]| {
        let mut all = vec!["create", "-q", "-f", "qcow2"];
        all.extend(args);
        ok(
            &timed_in(dir.path(), "qemu-img", &all, DEADLINE),
            "qemu-img create",
        );
    };
    create(&["sub/base.qcow2", "64M"]);
    create(&["-b", "base.qcow2", "-F", "qcow2", "sub/top.qcow2"]);
    create(&["-b", "sub/top.qcow2", "-F", "qcow2", "top2.qcow2"]);
    std::fs::rename(dir.file("sub/base.qcow2"), dir.file("sub/moved.qcow2")).unwrap();
    create(&["L1.qcow2", "1M"]);
    create(&["-b", "L1.qcow2", "-F", "qcow2", "L2.qcow2"]);
    qemu_img(&[
        "rebase",
        "-u",
        "-b",
        "L2.qcow2",
        "-F",
        "qcow2",
        &dir.file("L1.qcow2"),
    ]);
}

/// qemu-img's `info --output=json` of `image` without the keys that
/// name the file or measure its allocation.
fn info_json(image: &str) -> serde_json::Value {
    let out = ok(
        &qemu(&["info", "--output=json", "-U", image]),
        "qemu-img info",
    );
    let mut v: serde_json::Value = serde_json::from_str(&out).expect("info JSON");
    if let Some(m) = v.as_object_mut() {
        m.remove("filename");
        m.remove("actual-size");
    }
    v
}

#[test]
fn info_shows_images_whose_chain_is_broken() {
    let dir = TempDir::new("chains-info");
    broken(&dir);
    for image in ["sub/top.qcow2", "top2.qcow2", "L1.qcow2"] {
        for opts in [
            &[][..],
            &["-U"],
            &["--output=json"],
            &["--backing-chain"],
            &["--backing-chain", "--output=json"],
            &["-U", "--backing-chain"],
        ] {
            let mut args = vec!["info"];
            args.extend(opts);
            args.push(image);
            same_as_qemu_img(dir.path(), &args);
            let out = ch_in(dir.path(), &args);
            let chain = opts.contains(&"--backing-chain");
            // Without --backing-chain the top image shows; with it the
            // chain's break is the error.
            assert_eq!(out.status.success(), !chain, "{args:?}: {}", seen(&out));
            if !chain {
                assert!(
                    stdout(&out).contains("backing"),
                    "{args:?}: {}",
                    stdout(&out)
                );
            }
        }
    }
    let out = ch_in(dir.path(), &["info", "--backing-chain", "L1.qcow2"]);
    assert!(
        stderr(&out).contains("creates an infinite loop"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn rebase_u_repairs_a_moved_backing_file_as_qemu_img_does() {
    let dir = TempDir::new("chains-rebase");
    broken(&dir);
    std::fs::copy(dir.file("sub/top.qcow2"), dir.file("sub/q.qcow2")).unwrap();
    let ours = ch_in(
        dir.path(),
        &[
            "rebase",
            "-u",
            "-b",
            "moved.qcow2",
            "-F",
            "qcow2",
            "sub/top.qcow2",
        ],
    );
    ok(&ours, "ch-img rebase -u");
    let theirs = qemu(&[
        "rebase",
        "-u",
        "-b",
        "moved.qcow2",
        "-F",
        "qcow2",
        &dir.file("sub/q.qcow2"),
    ]);
    ok(&theirs, "qemu-img rebase -u");
    assert_eq!(
        info_json(&dir.file("sub/top.qcow2")),
        info_json(&dir.file("sub/q.qcow2")),
        "the rebased images differ"
    );
    // The chain opens again, through the repaired link.
    same_as_qemu_img(dir.path(), &["info", "--backing-chain", "top2.qcow2"]);
    ok(&ch_in(dir.path(), &["check", "top2.qcow2"]), "check");
    // Safe mode needs the old backing file's data, as in qemu-img; the
    // image is left as it was.
    let before = bytes(&dir.file("L1.qcow2"));
    let out = ch_in(
        dir.path(),
        &["rebase", "-b", "sub/moved.qcow2", "-F", "qcow2", "L1.qcow2"],
    );
    assert!(
        !out.status.success(),
        "safe rebase over a loop: {}",
        seen(&out)
    );
    unchanged(&dir.file("L1.qcow2"), &before, "safe rebase over a loop");
}

#[test]
fn create_u_records_a_backing_file_it_does_not_open() {
    let dir = TempDir::new("chains-create");
    for args in [
        &[
            "create", "-f", "qcow2", "-u", "-b", "missing", "-F", "qcow2", "X.qcow2", "64M",
        ][..],
        // The size is required, and so is the format.
        &[
            "create", "-f", "qcow2", "-u", "-b", "missing", "-F", "qcow2", "Y.qcow2",
        ],
        &[
            "create", "-f", "qcow2", "-u", "-b", "missing", "Z.qcow2", "64M",
        ],
        // Without -u the backing file must open.
        &[
            "create", "-f", "qcow2", "-b", "missing", "-F", "qcow2", "W.qcow2", "64M",
        ],
    ] {
        same_as_qemu_img(dir.path(), args);
    }
    // The image ch-img wrote (the last run of the first command) is
    // qemu-img's.
    ok(
        &qemu(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-u",
            "-b",
            "missing",
            "-F",
            "qcow2",
            &dir.file("Q.qcow2"),
            "64M",
        ]),
        "qemu-img create -u",
    );
    assert_eq!(
        info_json(&dir.file("X.qcow2")),
        info_json(&dir.file("Q.qcow2"))
    );
    for missing in ["Y.qcow2", "Z.qcow2", "W.qcow2"] {
        assert!(!dir.path().join(missing).exists(), "{missing} was created");
    }
}
