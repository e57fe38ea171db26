//! `ch-img commit` against `qemu-img commit` 7.2: twin images committed
//! by each tool end up reading and laid out the same, into the direct
//! backing file or (`-b`) a deeper base; `-p` reports at every percent.

mod ch_img_support;

use ch_img_support::{code, layout};
use integration_tests::{ch, ch_status, qemu_create_qcow2, qemu_img, qemu_io, TempDir};

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

/// `commit -p` reports at every percent, also inside one large allocated
/// extent: no two reports more than a point and a half apart (qemu-img's
/// own report is timing-driven, so not compared digit for digit),
/// starting at 0 and ending at 100, then "Image committed.".
#[test]
fn commit_progress_moves_at_every_percent() {
    let dir = TempDir::new("commit-p");
    let base = dir.file("base.qcow2");
    let top = dir.file("top.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "256M"]);
    qemu_img(&[
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
    qemu_io("qcow2", &top, &["write -P 3 0 256M"]);
    let out = ch(&["commit", "-p", &top]);
    let (reports, rest) = out.rsplit_once('\r').expect("progress reports");
    assert_eq!(rest, "\nImage committed.\n");
    let percents: Vec<f64> = reports
        .split('\r')
        .map(|r| {
            r.trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix("/100%)"))
                .and_then(|r| r.parse().ok())
                .unwrap_or_else(|| panic!("not a report: {r:?}"))
        })
        .collect();
    assert_eq!(percents.first(), Some(&0.0), "{percents:?}");
    assert_eq!(percents.last(), Some(&100.0), "{percents:?}");
    assert!(
        percents.len() > 60,
        "{} reports: {percents:?}",
        percents.len()
    );
    for w in percents.windows(2) {
        assert!(w[1] >= w[0] && w[1] - w[0] <= 1.5, "{percents:?}");
    }
    qemu_io("qcow2", &base, &["read -P 3 0 256M"]);
}
