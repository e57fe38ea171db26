//! `ch-img bitmap` against `qemu-img bitmap` 7.2 on copies of the same
//! image: the same messages and exit statuses, the same bitmaps listed
//! by `qemu-img info`, `qemu-img check` clean, and the same bits as QEMU
//! reads them (qemu-nbd exporting each bitmap, `nbdinfo --map`), also
//! after QEMU itself wrote into a bitmap ch-img made.

mod ch_img_support;

use ch_img_support::{assert_clean, ch_run, dirty_map, info_facts, qemu_run, Run, Tool};
use integration_tests::{qemu_img, qemu_io, TempDir};

/// Node names (`'#block117'`) and file names where qemu-img names the
/// node ("persistent in '...'", "persistent bitmaps to ...:") differ
/// between the tools: neutralised.
fn neutral(mut r: Run) -> Run {
    for (open, close) in [("persistent in '", "'"), ("persistent bitmaps to ", ":")] {
        let mut from = 0;
        while let Some(at) = r.stderr[from..].find(open).map(|i| i + from) {
            let start = at + open.len();
            let Some(len) = r.stderr[start..].find(close) else {
                break;
            };
            r.stderr.replace_range(start..start + len, "NODE");
            from = start;
        }
    }
    r
}

fn bitmap_names(img: &str) -> Vec<String> {
    info_facts(img)["format-specific"]["data"]["bitmaps"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|b| b["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The bitmaps QEMU can export (not marked in use).
fn consistent_bitmaps(img: &str) -> Vec<String> {
    info_facts(img)["format-specific"]["data"]["bitmaps"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|b| !b["flags"].as_array().unwrap().iter().any(|f| f == "in-use"))
                .map(|b| b["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn nbd_tools() -> bool {
    testkit::has_command("nbdinfo") && testkit::has_command("qemu-nbd")
}

/// Two copies of one image, one changed by each tool.
struct Pair {
    q: String,
    c: String,
}

impl Pair {
    fn new(dir: &TempDir, base: &str) -> Pair {
        let (q, c) = (dir.file("q.qcow2"), dir.file("c.qcow2"));
        std::fs::copy(base, &q).unwrap();
        std::fs::copy(base, &c).unwrap();
        Pair { q, c }
    }

    /// `bitmap ARGS IMG NAME...` with both tools: the same output.
    fn bitmap(&self, args: &[&str]) -> Run {
        let run = |tool: Tool, img: &str| {
            let argv: Vec<&str> = std::iter::once("bitmap")
                .chain(args.iter().map(|a| if *a == "IMG" { img } else { a }))
                .collect();
            neutral(tool(&argv, &[(img, "IMG")]))
        };
        let (q, c) = (run(qemu_run, &self.q), run(ch_run, &self.c));
        assert_eq!(q, c, "bitmap {args:?}");
        c
    }

    /// Both images list the same bitmaps, ours is clean, and QEMU reads
    /// the same bits from each bitmap of both.
    fn assert_same(&self, what: &str) {
        assert_eq!(info_facts(&self.q), info_facts(&self.c), "{what}");
        assert_clean(&self.c);
        if nbd_tools() {
            for name in consistent_bitmaps(&self.c) {
                assert_eq!(
                    dirty_map(&self.q, &name),
                    dirty_map(&self.c, &name),
                    "{what}: {name}"
                );
            }
        }
    }

    fn io(&self, cmds: &[&str]) {
        qemu_io("qcow2", &self.q, cmds);
        qemu_io("qcow2", &self.c, cmds);
    }
}

#[test]
fn bitmap_actions_match_qemu_img() {
    let dir = TempDir::new("bitmap");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "64M"]);
    let p = Pair::new(&dir, &base);
    let ok = |args: &[&str]| {
        let r = p.bitmap(args);
        assert_eq!(r.code, 0, "{args:?}: {r:?}");
        p.assert_same(&format!("{args:?}"));
    };
    ok(&["--add", "IMG", "b0"]);
    // QEMU records writes in the enabled bitmap ch-img added.
    p.io(&["write 0 64k", "write 1M 200k", "write 40M 1"]);
    if nbd_tools() {
        assert!(dirty_map(&p.c, "b0").contains("dirty"));
    }
    ok(&["--add", "-g", "1M", "--merge", "b0", "IMG", "b1"]);
    ok(&["--add", "-g", "512", "--disable", "IMG", "b2"]);
    ok(&["--merge", "b1", "IMG", "b2"]);
    ok(&["--clear", "IMG", "b0"]);
    p.io(&["write 7M 4k"]);
    ok(&["--enable", "--merge", "b0", "IMG", "b2"]);
    ok(&["--disable", "--enable", "--disable", "IMG", "b1"]);
    ok(&["--remove", "IMG", "b1"]);
    ok(&["--add", "--remove", "--add", "IMG", "b3"]);
    ok(&["--add", "-g", "2G", "IMG", "huge-granularity"]);
    ok(&["--merge", "b0", "IMG", "b0"]);
    // Refusals change nothing, in either tool.
    for args in [
        &["--add", "IMG", "b0"][..],
        &["--remove", "IMG", "nope"],
        &["--enable", "IMG", "nope"],
        &["--merge", "nope", "IMG", "b0"],
        &["--add", "-g", "3k", "IMG", "x"],
        &["--add", "-g", "256", "IMG", "x"],
        &["--add", "-g", "4G", "IMG", "x"],
        &["--add", "-g", "abc", "IMG", "x"],
        &["--add", "IMG", ""],
        &["IMG", "b0"],
        &["--add", "IMG"],
        &["--add", "IMG", "b6", "extra"],
        &["-g", "64k", "--remove", "IMG", "b0"],
        &["-b", "x", "--remove", "IMG", "b0"],
        &["-F", "qcow2", "--merge", "b0", "IMG", "b2"],
        &["--bogus", "IMG", "b0"],
    ] {
        let r = p.bitmap(args);
        assert_eq!(r.code, 1, "{args:?}");
        p.assert_same(&format!("{args:?}"));
    }
    let long = "x".repeat(1024);
    let r = p.bitmap(&["--add", "IMG", &long]);
    assert_eq!(r.code, 1);
    ok(&["--add", "IMG", &long[..1023]]);
    // Removing every bitmap drops the extension and its autoclear bit.
    for name in bitmap_names(&p.c) {
        ok(&["--remove", "IMG", &name]);
    }
    assert!(bitmap_names(&p.c).is_empty());
    let header = std::fs::read(&p.c).unwrap();
    assert_eq!(header[88..96], [0; 8], "autoclear bits left set");
}

#[test]
fn merge_from_another_image_like_qemu_img() {
    let dir = TempDir::new("bitmap");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "64M"]);
    qemu_img(&["bitmap", "--add", "-g", "1M", &base, "big"]);
    let src = dir.file("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &src, "64M"]);
    qemu_img(&["bitmap", "--add", "-g", "512", &src, "sb"]);
    qemu_io("qcow2", &src, &["write 100k 512", "write 3M 1"]);
    let small = dir.file("small.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &small, "32M"]);
    qemu_img(&["bitmap", "--add", &small, "ob"]);
    let p = Pair::new(&dir, &base);
    let r = p.bitmap(&["--merge", "sb", "-b", &src, "-F", "qcow2", "IMG", "big"]);
    assert_eq!(r.code, 0);
    p.assert_same("merge from -b");
    if nbd_tools() {
        assert_eq!(
            dirty_map(&p.c, "big"),
            "         0     1048576    1  dirty\n   1048576     2097152    0  clean\n   3145728     1048576    1  dirty\n   4194304    62914560    0  clean\n"
        );
    }
    // A missing source file: exit 1 and the file named (the causes are
    // worded differently).
    let missing = dir.file("missing.qcow2");
    let argv = [
        "bitmap",
        "--merge",
        "sb",
        "-b",
        missing.as_str(),
        p.c.as_str(),
        "big",
    ];
    let r = ch_run(&argv, &[(missing.as_str(), "MISSING")]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("TOOL: Could not open 'MISSING'"),
        "{r:?}"
    );
    for args in [
        vec!["--merge", "ob", "-b", small.as_str(), "IMG", "big"],
        vec!["--merge", "zz", "-b", src.as_str(), "IMG", "big"],
        vec![
            "--merge",
            "sb",
            "-b",
            src.as_str(),
            "-F",
            "raw",
            "IMG",
            "big",
        ],
    ] {
        let r = p.bitmap(&args);
        assert_eq!(r.code, 1, "{args:?}: {r:?}");
        p.assert_same(&format!("{args:?}"));
    }
}

#[test]
fn images_without_room_for_bitmaps_refuse_like_qemu_img() {
    let dir = TempDir::new("bitmap");
    let v2 = dir.file("v2.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "compat=0.10",
        &v2,
        "1M",
    ]);
    let raw = dir.file("r.raw");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "1M"]);
    let huge = dir.file("huge.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &huge, "100T"]);
    for (img, args) in [
        (&v2, vec!["--add", "IMG", "b0"]),
        (&v2, vec!["--remove", "IMG", "b0"]),
        (&raw, vec!["-f", "raw", "--add", "IMG", "b0"]),
        (&raw, vec!["-f", "raw", "--clear", "IMG", "b0"]),
        (&huge, vec!["--add", "-g", "512", "IMG", "b0"]),
    ] {
        let p = Pair::new(&dir, img);
        let r = p.bitmap(&args);
        assert_eq!(r.code, 1, "{args:?}");
        assert!(
            std::fs::read(&p.c).unwrap() == std::fs::read(img).unwrap(),
            "{args:?} changed the image"
        );
    }
    // A 100 TiB disk takes a 64 KiB-granularity bitmap (200 MiB of bits
    // that are all zero: nothing but the table is written).
    let p = Pair::new(&dir, &huge);
    assert_eq!(p.bitmap(&["--add", "IMG", "b0"]).code, 0);
    assert_eq!(info_facts(&p.q), info_facts(&p.c));
    assert_clean(&p.c);
}

/// A bitmap QEMU marked in use (it crashed while it was recording) can
/// only be removed.
#[test]
fn inconsistent_bitmaps_refuse_like_qemu_img() {
    let dir = TempDir::new("bitmap");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "64M"]);
    qemu_img(&["bitmap", "--add", &base, "b0"]);
    qemu_img(&["bitmap", "--add", &base, "b1"]);
    set_in_use(&base, 0);
    let p = Pair::new(&dir, &base);
    for args in [
        &["--clear", "IMG", "b0"][..],
        &["--enable", "IMG", "b0"],
        &["--disable", "IMG", "b0"],
        &["--merge", "b0", "IMG", "b1"],
        &["--merge", "b1", "IMG", "b0"],
    ] {
        assert_eq!(p.bitmap(args).code, 1, "{args:?}");
        p.assert_same(&format!("{args:?}"));
    }
    assert_eq!(p.bitmap(&["--add", "IMG", "b2"]).code, 0);
    assert_eq!(p.bitmap(&["--remove", "IMG", "b0"]).code, 0);
    p.assert_same("after removing the inconsistent bitmap");
}

/// Sets the in-use flag of directory entry `index` (entries of qemu's
/// making: no extra data).
fn set_in_use(img: &str, index: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut h = vec![0u8; 65536];
    f.read_exact_at(&mut h, 0).unwrap();
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
    let be64 = |b: &[u8], at: usize| u64::from_be_bytes(b[at..at + 8].try_into().unwrap());
    let mut at = be32(&h, 100) as usize;
    let (dir_size, dir_offset) = loop {
        let (kind, len) = (be32(&h, at), be32(&h, at + 4) as usize);
        assert_ne!(kind, 0, "no bitmaps extension");
        if kind == 0x2385_2875 {
            break (be64(&h, at + 16), be64(&h, at + 24));
        }
        at += 8 + len.next_multiple_of(8);
    };
    let mut dir = vec![0u8; dir_size as usize];
    f.read_exact_at(&mut dir, dir_offset).unwrap();
    let mut entry = 0usize;
    for _ in 0..index {
        let name = u16::from_be_bytes([dir[entry + 18], dir[entry + 19]]) as usize;
        entry += (24 + name).next_multiple_of(8);
    }
    let flags = be32(&dir, entry + 12) | 1;
    f.write_all_at(&flags.to_be_bytes(), dir_offset + entry as u64 + 12)
        .unwrap();
}

#[test]
fn qemu_copies_our_bitmaps() {
    let dir = TempDir::new("bitmap");
    let img = dir.file("img.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    integration_tests::ch(&["bitmap", "--add", "-g", "4k", &img, "b0"]);
    qemu_io("qcow2", &img, &["write 5M 12k"]);
    integration_tests::ch(&["bitmap", "--add", "--merge", "b0", &img, "copy"]);
    let out = dir.file("out.qcow2");
    qemu_img(&["convert", "--bitmaps", "-O", "qcow2", &img, &out]);
    assert_eq!(bitmap_names(&out), ["b0", "copy"]);
    assert_clean(&out);
    if nbd_tools() {
        // 4 KiB bits in b0; the copy has the default 64 KiB granularity.
        for (name, len) in [("b0", "12288"), ("copy", "65536")] {
            let map = dirty_map(&out, name);
            assert!(
                map.contains(&format!("   5242880 {len:>11}    1  dirty")),
                "{name}: {map}"
            );
        }
    }
}
