//! `ch-img dd` against `qemu-img dd` 7.2: the same operands give the same
//! output, exit status and output image (contents, size, format, layout).

mod ch_img_support;

use ch_img_support::{
    assert_clean, assert_same_contents, ch_run, info_facts, layout, qemu_run, Run, Tool,
};
use integration_tests::{qemu_img, qemu_io, TempDir};

/// A 10 MiB qcow2 input with data at 0-3 MiB and 4-5 MiB.
fn input(dir: &TempDir) -> String {
    let img = dir.file("in.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "10M"]);
    qemu_io(
        "qcow2",
        &img,
        &[
            "write -P 1 0 1M",
            "write -P 2 1M 1M",
            "write -P 3 2M 1M",
            "write -P 5 4M 1M",
        ],
    );
    img
}

/// Runs `dd ARGS if=INPUT of=OUT` with both tools, each to its own output.
fn both(dir: &TempDir, input: &str, args: &[&str]) -> (Run, Run, String, String) {
    let (q, c) = (dir.file("q.out"), dir.file("c.out"));
    let _ = std::fs::remove_file(&q);
    let _ = std::fs::remove_file(&c);
    let run = |tool: Tool, out: &str| {
        let (i, o) = (format!("if={input}"), format!("of={out}"));
        let mut argv = vec!["dd"];
        argv.extend_from_slice(args);
        argv.extend([i.as_str(), o.as_str()]);
        tool(&argv, &[(out, "OUT"), (input, "IN")])
    };
    (run(qemu_run, &q), run(ch_run, &c), q, c)
}

#[test]
fn dd_matches_qemu_img() {
    let dir = TempDir::new("dd");
    let input = input(&dir);
    for args in [
        &[][..],
        &["bs=1M", "count=5", "skip=2"],
        &["bs=1M", "skip=2"],
        &["bs=1M", "count=5"],
        &["bs=1M", "count=50"],
        &["bs=1M", "count=5", "skip=5"],
        &["bs=3000", "count=7"],
        &["bs=1k", "bs=64k", "count=3", "skip=1.5k"],
        &["-f", "qcow2", "-O", "qcow2", "bs=64k", "skip=3"],
        &["-O", "qcow2", "bs=1M", "count=3"],
        &["-O", "qcow2", "bs=1", "count=1"],
        &["-U", "count=1k"],
        // skip past the end: a warning, an empty output, exit 0.
        &["bs=1M", "skip=20"],
        &["bs=1M", "count=5", "skip=6"],
    ] {
        let (q, c, qout, cout) = both(&dir, &input, args);
        assert_eq!(q, c, "dd {args:?}");
        assert_eq!(c.code, 0, "dd {args:?}: {c:?}");
        assert_eq!(info_facts(&qout), info_facts(&cout), "dd {args:?}");
        assert_same_contents(&qout, &cout);
        assert_eq!(layout(&qout), layout(&cout), "dd {args:?}");
        if args.contains(&"qcow2") {
            assert_clean(&cout);
        }
    }
}

#[test]
fn dd_refuses_what_qemu_img_refuses() {
    let dir = TempDir::new("dd");
    let input = input(&dir);
    for args in [
        &["bs=0"][..],
        &["bs=2G"],
        &["bs=1x"],
        &["count=-1"],
        &["skip=z"],
        &["foo=1"],
        &["extra"],
        &["-O", "bogus"],
        &["-f", "bogus"],
        &["-p"],
    ] {
        let (q, c, _, cout) = both(&dir, &input, args);
        assert_eq!(q, c, "dd {args:?}");
        assert_eq!(c.code, 1, "dd {args:?}");
        assert!(!std::path::Path::new(&cout).exists(), "dd {args:?}");
    }
    // A missing input or output file name, and an input that does not open.
    let missing = dir.file("missing.qcow2");
    let of = format!("of={}", dir.file("x.out"));
    let if_missing = format!("if={missing}");
    for args in [
        vec!["dd", "if=in"],
        vec!["dd", of.as_str()],
        vec!["dd", if_missing.as_str(), of.as_str()],
    ] {
        let names = [(missing.as_str(), "MISSING")];
        let (q, c) = (qemu_run(&args, &names), ch_run(&args, &names));
        assert_eq!((q.code, c.code), (1, 1), "{args:?}: {c:?}");
        if args.len() == 2 {
            assert_eq!(q, c);
        } else {
            assert!(c.stderr.contains("Could not open 'MISSING'"), "{c:?}");
        }
    }
}

#[test]
fn dd_never_overwrites_its_input() {
    let dir = TempDir::new("dd");
    let input = input(&dir);
    let keep = std::fs::read(&input).unwrap();
    let overlay = dir.file("top.qcow2");
    integration_tests::qemu_create_overlay(&overlay, "in.qcow2", "qcow2");
    let link = dir.file("link.qcow2");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let hard = dir.file("hard.qcow2");
    std::fs::hard_link(&input, &hard).unwrap();
    let dotted = format!("{}/./in.qcow2", dir.path().display());
    for (src, out) in [
        (&input, &input),
        (&input, &dotted),
        (&input, &link),
        (&input, &hard),
        (&overlay, &input),
    ] {
        let (i, o) = (format!("if={src}"), format!("of={out}"));
        let c = ch_run(&["dd", "-O", "qcow2", &i, &o], &[]);
        assert_eq!(c.code, 1, "dd {i} {o}: {c:?}");
        assert!(c.stderr.contains("Failed to get \"write\" lock"), "{c:?}");
        assert_eq!(std::fs::read(&input).unwrap(), keep, "dd {i} {o}");
    }
    // qemu-img refuses the qcow2 case on its lock too.
    let (i, o) = (format!("if={input}"), format!("of={input}"));
    assert_eq!(qemu_run(&["dd", "-O", "qcow2", &i, &o], &[]).code, 1);
}
