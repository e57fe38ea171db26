//! `ch-img bench`: the pattern it writes, its JSON report, and the
//! command lines `qemu-img bench` 7.2 refuses.

mod ch_img_support;

use ch_img_support::code;
use integration_tests::{ch, ch_status, json, qemu_img, qemu_img_status, qemu_io, TempDir};

#[test]
fn bench_writes_the_pattern_and_reports_json() {
    let dir = TempDir::new("cli");
    let img = dir.file("b.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "4M"]);
    let out = ch(&[
        "bench",
        "-w",
        "-c",
        "512",
        "-d",
        "8",
        "-s",
        "8k",
        "--pattern=7",
        "--flush-interval=64",
        &img,
    ]);
    assert!(out.starts_with("Sending 512 write requests, 8192 bytes each, 8 in parallel (starting at offset 0, step size 8192)\nSending flush every 64 requests\nRun completed in "), "{out}");
    qemu_img(&["check", &img]);
    // 512 x 8 KiB = the whole 4 MiB disk, every byte the pattern.
    qemu_io("qcow2", &img, &["read -P 7 0 4M"]);
    let j = json(&ch(&[
        "bench",
        "-c",
        "300",
        "-d",
        "4",
        "--random",
        "--seed",
        "9",
        "--rw-mix=50",
        "--output=json",
        &img,
    ]));
    for key in ["ops_per_sec", "mib_per_sec", "lat_mean_us", "lat_p99_us"] {
        assert!(j[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {j}");
    }
    assert_eq!(j["requests"], 300);
    qemu_img(&["check", &img]);
}

#[test]
fn bench_refuses_what_qemu_img_refuses() {
    let dir = TempDir::new("cli");
    let img = dir.file("b.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "4M"]);
    for args in [
        vec![
            "bench",
            "-w",
            "-c",
            "10",
            "--flush-interval=10",
            img.as_str(),
        ],
        vec!["bench", "-c", "10", "-n", img.as_str()],
        vec!["bench", "-c", "10", "-i", "bogus", img.as_str()],
        vec!["bench", "-c", "10", "-d", "0", img.as_str()],
    ] {
        assert_eq!(
            code(&qemu_img_status_or_skip_hang(&args)),
            1,
            "qemu-img {args:?}"
        );
        assert_eq!(code(&ch_status(&args[..])), 1, "ch-img {args:?}");
    }
}

/// qemu-img bench -d 0 never returns; ch-img refuses it. Only ask qemu-img
/// the other questions.
fn qemu_img_status_or_skip_hang(args: &[&str]) -> std::process::Output {
    if args.windows(2).any(|w| w == ["-d", "0"]) {
        return ch_status(args);
    }
    qemu_img_status(args)
}
