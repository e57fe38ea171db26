//! Shared by the ch_img_* test files that hold ch-img's verbs against
//! qemu-img's (one file per verb): running the same command line through
//! qemu-img and ch-img and comparing what each prints, its exit status
//! and the image it leaves; a sample image; the facts of an image
//! (info, check, map, a bitmap's dirty map) that do not depend on where
//! its clusters lie.
#![allow(dead_code)]

use std::process::Output;

use integration_tests::{ch_status, json, qemu_img, qemu_img_status, qemu_io, TempDir};

/// What a run printed on stdout.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A run's exit status (-1 when a signal ended it).
pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// A 16 MiB qcow2 image `name` in `dir`, made by qemu-img, with data
/// (0..100k and a 4 KiB run at 5M), a zero cluster (1M) and holes.
pub fn sample_qcow2(dir: &TempDir, name: &str) -> String {
    let img = dir.file(name);
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    qemu_io(
        "qcow2",
        &img,
        &[
            "write -P 0xab 0 100k",
            "write -z 1M 64k",
            "write -P 0xcd 5M 4k",
        ],
    );
    img
}

/// `qemu-img map --output=json` without the host offsets (which follow
/// allocation order): the extents and their flags.
pub fn layout(img: &str) -> serde_json::Value {
    let mut j = json(&qemu_img(&["map", "--output=json", img]));
    for e in j.as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("offset");
    }
    j
}

/// What one run printed and returned, with the tool's name and the
/// given file names neutralised so two runs compare.
#[derive(Debug, PartialEq, Eq)]
pub struct Run {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl Run {
    fn of(o: &Output, tool: &str, names: &[(&str, &str)]) -> Run {
        let clean = |b: &[u8]| {
            let mut s = String::from_utf8_lossy(b).into_owned();
            for (from, to) in names {
                s = s.replace(from, to);
            }
            // "qemu-img: ...", and hints such as "'qemu-img rebase'".
            s.replace(&format!("{tool}:"), "TOOL:")
                .replace(&format!("'{tool} "), "'TOOL ")
        };
        Run {
            stdout: clean(&o.stdout),
            stderr: clean(&o.stderr),
            code: o.status.code().unwrap_or(-1),
        }
    }
}

/// [`qemu_run`] or [`ch_run`].
pub type Tool = fn(&[&str], &[(&str, &str)]) -> Run;

/// `qemu-img ARGS` as a [`Run`]; `names` are replaced in its output.
pub fn qemu_run(args: &[&str], names: &[(&str, &str)]) -> Run {
    Run::of(&qemu_img_status(args), "qemu-img", names)
}

/// `ch-img ARGS` as a [`Run`]; `names` are replaced in its output.
pub fn ch_run(args: &[&str], names: &[(&str, &str)]) -> Run {
    Run::of(&ch_status(args), "ch-img", names)
}

/// Runs `args` through both tools, each with `{}` in an argument
/// replaced by its own file (`q` for qemu-img, `c` for ch-img), and
/// asserts they print the same and exit the same (the files' names
/// replaced by IMG).
pub fn assert_same_run(args: &[&str], q: &str, c: &str) -> Run {
    let qa: Vec<String> = args.iter().map(|a| a.replace("{}", q)).collect();
    let ca: Vec<String> = args.iter().map(|a| a.replace("{}", c)).collect();
    let qa: Vec<&str> = qa.iter().map(String::as_str).collect();
    let ca: Vec<&str> = ca.iter().map(String::as_str).collect();
    let qr = qemu_run(&qa, &[(q, "IMG")]);
    let cr = ch_run(&ca, &[(c, "IMG")]);
    assert_eq!(qr, cr, "qemu-img and ch-img differ on {args:?}");
    cr
}

/// `qemu-img info --output=json` without the keys that name the file or
/// depend on where its clusters lie (`filename`, `actual-size`, the
/// `full-backing-filename`).
pub fn info_facts(img: &str) -> serde_json::Value {
    let mut j = json(&qemu_img(&["info", "--output=json", img]));
    let o = j.as_object_mut().unwrap();
    for key in ["filename", "actual-size", "full-backing-filename"] {
        o.remove(key);
    }
    j
}

/// `qemu-img check --output=json`'s findings (not the cluster counts,
/// which follow the layout): corruptions, leaks, errors, and the
/// image's allocated and compressed clusters.
pub fn check_facts(img: &str) -> serde_json::Value {
    let out = qemu_img_status(&["check", "--output=json", img]);
    let mut j = json(&String::from_utf8_lossy(&out.stdout));
    let o = j.as_object_mut().unwrap();
    for key in ["filename", "image-end-offset", "fragmented-clusters"] {
        o.remove(key);
    }
    j
}

/// Asserts qemu-img finds `img` clean (exit 0, no leak, no corruption).
pub fn assert_clean(img: &str) {
    let out = qemu_img_status(&["check", img]);
    assert!(
        out.status.success(),
        "qemu-img check {img}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("No errors were found"), "{text}");
}

/// Asserts both images read the same (`qemu-img compare`).
pub fn assert_same_contents(a: &str, b: &str) {
    qemu_img(&["compare", a, b]);
}

/// `nbdinfo --map` of bitmap `name` as qemu-nbd exports it: what QEMU
/// reads of it. coreutils' `timeout` ends nbdinfo, which ends the
/// qemu-nbd it started.
pub fn dirty_map(img: &str, name: &str) -> String {
    let map = format!("--map=qemu:dirty-bitmap:{name}");
    let out = testkit::output_within(
        std::process::Command::new("timeout").args([
            "30", "nbdinfo", &map, "--", "[", "qemu-nbd", "-r", "-f", "qcow2", "-B", name, img, "]",
        ]),
        testkit::COMMAND_LIMIT,
    );
    assert!(
        out.status.success(),
        "nbdinfo {img} {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
