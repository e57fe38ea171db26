//! Issue 34: `ch-img convert` of a damaged qcow2 image salvages what can
//! be read, as qemu-img 7.2 does. Where the metadata puts guest bytes
//! past the end of the file (an L2 entry, an L1 entry, a file cut short)
//! qemu-img reads zeroes there, converts the rest and exits 0; ch-img
//! writes the same output (byte for byte as raw, the same map as qcow2),
//! exits 0 too, and names each lost range on stderr. Damage qemu-img
//! refuses (a compressed cluster past the end) is refused by both. The
//! source is never written, and `check` still reports the damage. Each
//! damaged image is a qemu-img-made image with a few bytes poked.

mod ch_img_support;

use ch_img_support::{code, layout};
use integration_tests::{
    assert_same_bytes, ch_status, qemu_img, qemu_img_status, qemu_io, TempDir,
};

const MIB: u64 = 1 << 20;
/// Cluster size of the images (qemu-img's default).
const CS: u64 = 65536;
/// A host offset far past the end of every image here.
const FAR: u64 = 0x1000_0000;
/// QCOW_OFLAG_COPIED.
const COPIED: u64 = 1 << 63;

fn be64(b: &[u8], at: u64) -> u64 {
    u64::from_be_bytes(b[at as usize..at as usize + 8].try_into().unwrap())
}

fn put64(b: &mut [u8], at: u64, v: u64) {
    b[at as usize..at as usize + 8].copy_from_slice(&v.to_be_bytes());
}

/// The L1 table's offset and the first L2 table's offset of an image's
/// bytes (one L2 table covers all of these small images).
fn tables(b: &[u8]) -> (u64, u64) {
    let l1 = be64(b, 40);
    (l1, be64(b, l1) & 0x00ff_ffff_ffff_fe00)
}

/// An 8 MiB qcow2 image, every cluster allocated: 0x11 in the first
/// 4 MiB, 0x22 in the rest.
fn full_image(dir: &TempDir, name: &str) -> String {
    let img = dir.file(name);
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "8M"]);
    qemu_io(
        "qcow2",
        &img,
        &["write -P 0x11 0 4M", "write -P 0x22 4M 4M"],
    );
    img
}

/// What converting a damaged image must give.
enum Expect {
    /// Both tools convert it; ch-img reports these guest bytes as lost.
    Salvaged { lost: (u64, u64) },
    /// Both tools refuse it (exit 1).
    Refused,
}

/// Converts `sources` with both tools to raw and to qcow2 and holds
/// ch-img to qemu-img's result and to `expect`.
fn converts_like_qemu_img(dir: &TempDir, case: &str, sources: &[&str], expect: &Expect) {
    let before: Vec<Vec<u8>> = sources.iter().map(|s| std::fs::read(s).unwrap()).collect();
    for fmt in ["raw", "qcow2"] {
        let (q, c) = (dir.file(&format!("q.{fmt}")), dir.file(&format!("c.{fmt}")));
        let _ = (std::fs::remove_file(&q), std::fs::remove_file(&c));
        let args = |out: &str| {
            let mut a = vec!["convert", "-O", fmt];
            a.extend(sources);
            a.push(out);
            a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        };
        let (qa, ca) = (args(&q), args(&c));
        let theirs = qemu_img_status(&qa.iter().map(String::as_str).collect::<Vec<_>>());
        let ours = ch_status(&ca.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&ours.stderr).into_owned();
        match expect {
            Expect::Salvaged { lost } => {
                assert_eq!(code(&theirs), 0, "{case}: qemu-img {fmt}: {theirs:?}");
                assert_eq!(code(&ours), 0, "{case}: ch-img {fmt}: {err}");
                let lines: Vec<&str> = err.lines().collect();
                let named = format!("bytes {}..{} of the source cannot be read", lost.0, lost.1);
                assert!(
                    lines.len() == 1 && lines[0].contains(&named),
                    "{case} {fmt}: expected one report of {named:?}, got {err:?}"
                );
                assert!(
                    lines[0].contains("beyond the end of the file"),
                    "{case}: {err}"
                );
                if fmt == "raw" {
                    assert_same_bytes(&q, &c);
                } else {
                    qemu_img(&["compare", &q, &c]);
                    assert_eq!(layout(&c), layout(&q), "{case}: the maps differ");
                    qemu_img(&["check", &c]);
                }
            }
            Expect::Refused => {
                assert_eq!(code(&theirs), 1, "{case}: qemu-img {fmt}: {theirs:?}");
                assert_eq!(code(&ours), 1, "{case}: ch-img {fmt}: {err}");
                assert!(err.contains("beyond the end of the file"), "{case}: {err}");
            }
        }
    }
    for (s, bytes) in sources.iter().zip(&before) {
        assert!(
            std::fs::read(s).unwrap() == *bytes,
            "{case}: convert changed the source {s}"
        );
    }
}

/// `ch-img check` still finds the damage, with qemu-img's exit status.
fn check_reports_damage(case: &str, img: &str) {
    let theirs = qemu_img_status(&["check", img]);
    let ours = ch_status(&["check", img]);
    assert_ne!(code(&ours), 0, "{case}: ch-img check found nothing");
    assert_eq!(code(&ours), code(&theirs), "{case}: check's exit status");
}

/// Pokes `img` with `f` and returns it.
fn poke(img: String, f: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut bytes = std::fs::read(&img).unwrap();
    f(&mut bytes);
    std::fs::write(&img, &bytes).unwrap();
    img
}

#[test]
fn l2_entry_past_the_end_is_salvaged_around() {
    let dir = TempDir::new("damaged");
    let img = poke(full_image(&dir, "l2.qcow2"), |b| {
        let (_, l2) = tables(b);
        put64(b, l2 + 8 * 5, COPIED | FAR);
    });
    let lost = (5 * CS, 6 * CS);
    converts_like_qemu_img(&dir, "L2 entry", &[&img], &Expect::Salvaged { lost });
    check_reports_damage("L2 entry", &img);
}

#[test]
fn l1_entry_past_the_end_loses_what_its_table_maps() {
    let dir = TempDir::new("damaged");
    let img = poke(full_image(&dir, "l1.qcow2"), |b| {
        let (l1, _) = tables(b);
        put64(b, l1, COPIED | FAR);
    });
    // The table would map 512 MiB; the disk has 8.
    let lost = (0, 8 * MIB);
    converts_like_qemu_img(&dir, "L1 entry", &[&img], &Expect::Salvaged { lost });
    check_reports_damage("L1 entry", &img);
}

#[test]
fn a_truncated_file_is_salvaged_up_to_its_end() {
    let dir = TempDir::new("damaged");
    let mut first_lost = 0;
    let img = poke(full_image(&dir, "cut.qcow2"), |b| {
        let (_, l2) = tables(b);
        // Cut inside a data cluster: its start still reads, its end reads
        // as zeroes; every cluster after the end of the file is lost.
        let cut = (be64(b, l2 + 8 * 70) & !COPIED) + 12345;
        b.truncate(cut as usize);
        let limit = cut.div_ceil(CS) * CS;
        first_lost = (0..128)
            .find(|i| be64(b, l2 + 8 * i) & !COPIED >= limit)
            .unwrap()
            * CS;
    });
    let lost = (first_lost, 8 * MIB);
    converts_like_qemu_img(&dir, "truncated", &[&img], &Expect::Salvaged { lost });
    check_reports_damage("truncated", &img);
}

#[test]
fn damage_in_a_backing_file_or_a_later_source_is_named_at_its_disk_offset() {
    let dir = TempDir::new("damaged");
    let img = poke(full_image(&dir, "base.qcow2"), |b| {
        let (_, l2) = tables(b);
        put64(b, l2 + 8 * 9, COPIED | FAR);
    });
    let top = dir.file("top.qcow2");
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", &img, "-F", "qcow2", &top,
    ]);
    qemu_io("qcow2", &top, &["write -P 0x33 0 64k"]);
    let lost = (9 * CS, 10 * CS);
    converts_like_qemu_img(&dir, "backing", &[&top], &Expect::Salvaged { lost });
    let clean = full_image(&dir, "clean.qcow2");
    let lost = (8 * MIB + 9 * CS, 8 * MIB + 10 * CS);
    converts_like_qemu_img(
        &dir,
        "second source",
        &[&clean, &img],
        &Expect::Salvaged { lost },
    );
}

#[test]
fn a_compressed_cluster_past_the_end_is_refused_like_qemu_img() {
    let dir = TempDir::new("damaged");
    let raw = dir.file("text.raw");
    std::fs::write(&raw, b"compressible text ".repeat(60_000)).unwrap();
    let img = dir.file("compressed.qcow2");
    qemu_img(&["convert", "-c", "-f", "raw", "-O", "qcow2", &raw, &img]);
    let img = poke(img, |b| {
        let (_, l2) = tables(b);
        // A compressed entry: the host offset is the low 54 bits
        // (64 KiB clusters).
        let e = be64(b, l2 + 8);
        assert!(e & (1 << 62) != 0, "cluster 1 is not compressed");
        put64(b, l2 + 8, (e & !((1 << 54) - 1)) | FAR);
    });
    converts_like_qemu_img(&dir, "compressed", &[&img], &Expect::Refused);
}
