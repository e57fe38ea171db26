//! `ch-img compare` against `qemu-img compare` 7.2: the verdict, the
//! progress report of `-p` (digit for digit, carriage returns included)
//! and the exit status, on images of equal and of different sizes.

mod ch_img_support;

use ch_img_support::{ch_run, code, qemu_run, sample_qcow2, stdout};
use integration_tests::{ch_status, qemu_img, qemu_img_status, qemu_io, TempDir};

#[test]
fn compare_progress_matches_qemu_img() {
    let dir = TempDir::new("compare");
    let f = |name: &str| dir.file(name);
    let (a, b, c, d, e) = (
        f("a.qcow2"),
        f("b.qcow2"),
        f("c.qcow2"),
        f("d.raw"),
        f("e.qcow2"),
    );
    qemu_img(&["create", "-q", "-f", "qcow2", &a, "60M"]);
    qemu_io("qcow2", &a, &["write -P 1 0 20M", "write -P 2 40M 1M"]);
    // The same disk laid out by convert, and the same bytes in a raw file.
    qemu_img(&["convert", "-O", "qcow2", &a, &b]);
    qemu_img(&["convert", "-O", "raw", &a, &d]);
    // One byte off in the middle of the second data range.
    qemu_img(&["convert", "-O", "qcow2", &a, &c]);
    qemu_io("qcow2", &c, &["write -P 9 40M 512"]);
    // A longer image: empty, then with data in its tail.
    qemu_img(&["create", "-q", "-f", "qcow2", &e, "70M"]);
    let zeroes = f("z.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &zeroes, "60M"]);
    qemu_io("qcow2", &zeroes, &["write -z 0 1M"]);
    let tail = f("t.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &tail, "70M"]);
    qemu_io("qcow2", &tail, &["write -P 3 65M 4k"]);
    let names = [
        (a.as_str(), "A"),
        (b.as_str(), "B"),
        (c.as_str(), "C"),
        (d.as_str(), "D"),
        (e.as_str(), "E"),
        (tail.as_str(), "T"),
        (zeroes.as_str(), "Z"),
    ];
    let pairs = [
        (&a, &b, 0),
        (&a, &d, 0),
        (&a, &c, 1),
        (&e, &e, 0),
        (&zeroes, &e, 0),
        (&zeroes, &tail, 1),
        (&a, &e, 1),
    ];
    for (x, y, verdict) in pairs {
        for flags in [&[][..], &["-p"], &["-p", "-q"], &["-p", "-s"], &["-s"]] {
            let mut args = vec!["compare"];
            args.extend_from_slice(flags);
            args.extend([x.as_str(), y.as_str()]);
            let (q, ch) = (qemu_run(&args, &names), ch_run(&args, &names));
            assert_eq!(q, ch, "{args:?}");
            if !flags.contains(&"-s") {
                assert_eq!(ch.code, verdict, "{args:?}: {ch:?}");
            }
            if flags == ["-p"] {
                assert!(ch.stdout.starts_with("    (0.00/100%)\r"), "{ch:?}");
                assert!(ch.stdout.ends_with("!\n\n") || ch.stdout.ends_with(".\n\n"));
            }
        }
    }
    // A missing image: the error, exit 2, and with -p the report's newline.
    let missing = f("missing.qcow2");
    let args = ["compare", "-p", missing.as_str(), a.as_str()];
    let ch = ch_run(&args, &names);
    assert_eq!((ch.code, ch.stdout.as_str()), (2, "\n"), "{ch:?}");
    assert_eq!(qemu_run(&args, &names).stdout, "\n");
}

#[test]
fn compare_exit_codes_and_messages() {
    let dir = TempDir::new("cli");
    let a = sample_qcow2(&dir, "a.qcow2");
    let b = dir.file("b.raw");
    qemu_img(&["convert", "-O", "raw", &a, &b]);
    let q = qemu_img_status(&["compare", &a, &b]);
    let c = ch_status(&["compare", &a, &b]);
    assert_eq!((code(&q), stdout(&q)), (code(&c), stdout(&c)));
    assert_eq!(code(&c), 0);
    qemu_io("raw", &b, &["write -P 0x1 5M 1"]);
    let q = qemu_img_status(&["compare", &a, &b]);
    let c = ch_status(&["compare", &a, &b]);
    assert_eq!((code(&q), stdout(&q)), (code(&c), stdout(&c)));
    assert_eq!(
        stdout(&c),
        format!("Content mismatch at offset {}!\n", 5 << 20)
    );
    let missing = dir.file("missing.qcow2");
    assert_eq!(code(&ch_status(&["compare", &a, &missing])), 2);
}
