//! A corpus of damaged images, each made from a qemu-img image with byte
//! pokes, run through (1) a write from a queue (refused when it would
//! touch metadata: corrupt bit set; `qemu-img check` no worse than
//! before), (2) our check (the same exit-code class as qemu-img's:
//! 0 clean, 2 corruptions, 3 leaks only), (3) our `check -r all`, which
//! must leave `qemu-img check` clean wherever qemu-img's own repair does,
//! with every cluster reading as qemu-img's repaired copy reads.
//!
//! `cargo test -p block --test qcow2_damaged -- --nocapture` prints the
//! counts table docs/qcow2.md shows.

mod support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use block::check::{check_image, Repair};
use block::{BlockError, Disk, DiskOptions};
use support::*;

fn be64(b: &[u8], at: u64) -> u64 {
    u64::from_be_bytes(b[at as usize..at as usize + 8].try_into().unwrap())
}

fn poke(p: &Path, off: u64, bytes: &[u8]) {
    let f = std::fs::File::options().write(true).open(p).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

fn poke64(p: &Path, off: u64, v: u64) {
    poke(p, off, &v.to_be_bytes());
}

/// Where qemu-img put things (64 KiB clusters).
struct Layout {
    cs: u64,
    rt: u64,
    rb: u64,
    l1: u64,
    /// L2 table of L1 entry 0.
    l2: u64,
    /// Host cluster of guest cluster 0.
    data0: u64,
    snapshots: u64,
}

fn layout(p: &Path) -> Layout {
    let b = std::fs::read(p).unwrap();
    let cs = 1u64 << u32::from_be_bytes(b[20..24].try_into().unwrap());
    let rt = be64(&b, 48);
    let l1 = be64(&b, 40);
    let mask = 0x00ff_ffff_ffff_fe00;
    let l2 = be64(&b, l1) & mask;
    Layout {
        cs,
        rt,
        rb: be64(&b, rt) & mask,
        l1,
        l2,
        data0: if l2 == 0 { 0 } else { be64(&b, l2) & mask },
        snapshots: be64(&b, 64),
    }
}

const COPIED: u64 = 1 << 63;

struct Case {
    name: &'static str,
    /// qemu-img create -o options.
    opts: &'static str,
    snapshot: bool,
    poke: fn(&Path, &Layout),
    /// The queue's writes must be refused for touching metadata
    /// (corrupt bit set).
    write_refused: bool,
}

impl Case {
    /// qemu-img reads what its repair left (not so for a v2 zero flag,
    /// which its check passes and its reads refuse).
    fn qemu_reads(&self) -> bool {
        self.opts != "compat=0.10"
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "refcount table entry emptied",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.rt, 0),
            write_refused: false,
        },
        Case {
            name: "refcount block emptied",
            opts: "",
            snapshot: false,
            poke: |p, l| poke(p, l.rb, &vec![0u8; l.cs as usize]),
            write_refused: false,
        },
        Case {
            name: "refcount table at offset 0",
            opts: "",
            snapshot: false,
            poke: |p, _| poke64(p, 48, 0),
            // Refused at open already (qemu opens it).
            write_refused: false,
        },
        Case {
            name: "L2 entry into the L1 table",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, l.l1 | COPIED),
            write_refused: true,
        },
        Case {
            name: "L2 entry into the refcount table",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, l.rt | COPIED),
            write_refused: true,
        },
        Case {
            name: "L2 entry into a refcount block",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, l.rb | COPIED),
            write_refused: true,
        },
        Case {
            name: "L2 entry into a snapshot's L1 table",
            opts: "",
            snapshot: true,
            poke: |p, l| {
                let b = std::fs::read(p).unwrap();
                let sn_l1 = be64(&b, l.snapshots);
                poke64(p, l.l2, sn_l1 | COPIED);
            },
            write_refused: true,
        },
        Case {
            name: "L1 entry into the L1 table",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l1, l.l1 | COPIED),
            write_refused: true,
        },
        Case {
            name: "L1 entry into the refcount table",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l1, l.rt | COPIED),
            write_refused: true,
        },
        Case {
            name: "refcount of the L1 table zeroed",
            opts: "",
            snapshot: false,
            poke: |p, l| poke(p, l.rb + 2 * (l.l1 / l.cs), &[0, 0]),
            write_refused: true,
        },
        Case {
            name: "reserved bits in an L2 entry",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, l.data0 | COPIED | 1 << 57),
            write_refused: false,
        },
        Case {
            name: "reserved bits in an L1 entry",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l1, l.l2 | COPIED | 1 << 3),
            write_refused: false,
        },
        Case {
            name: "zero flag in a version 2 image",
            opts: "compat=0.10",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, l.data0 | COPIED | 1),
            write_refused: false,
        },
        Case {
            name: "unaligned L2 entry",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, (l.data0 + 512) | COPIED),
            write_refused: false,
        },
        Case {
            name: "L2 entry past the end of the file",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, (l.data0 + 64 * l.cs) | COPIED),
            write_refused: false,
        },
        Case {
            name: "OFLAG_COPIED cleared",
            opts: "",
            snapshot: false,
            poke: |p, l| poke64(p, l.l2, l.data0),
            write_refused: false,
        },
        Case {
            name: "snapshot table with too many entries",
            opts: "",
            snapshot: true,
            poke: |p, _| poke(p, 60, &100_000u32.to_be_bytes()),
            write_refused: false,
        },
        Case {
            name: "snapshot table past the end of the file",
            opts: "",
            snapshot: true,
            poke: |p, _| poke64(p, 64, 1 << 40),
            write_refused: false,
        },
        Case {
            name: "snapshot entry without version 3's extra data",
            opts: "",
            snapshot: true,
            poke: |p, l| {
                // The same entry with no extra data: the id and name move
                // up, the rest of the table's bytes are zeroed.
                let b = std::fs::read(p).unwrap();
                let at = l.snapshots as usize;
                let be16 = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]) as usize;
                let (id_len, name_len) = (be16(at + 12), be16(at + 14));
                let extra = u32::from_be_bytes(b[at + 36..at + 40].try_into().unwrap()) as usize;
                let mut entry = b[at..at + 40].to_vec();
                entry[36..40].fill(0);
                let names = at + 40 + extra;
                entry.extend_from_slice(&b[names..names + id_len + name_len]);
                let old_len = (40 + extra + id_len + name_len).next_multiple_of(8);
                entry.resize(old_len, 0);
                poke(p, l.snapshots, &entry);
            },
            write_refused: false,
        },
        Case {
            name: "snapshot L1 table unaligned",
            opts: "",
            snapshot: true,
            poke: |p, l| {
                let b = std::fs::read(p).unwrap();
                poke64(p, l.snapshots, be64(&b, l.snapshots) + 8);
            },
            write_refused: false,
        },
    ]
}

/// (exit code, corruptions, leaks) of `qemu-img check`.
fn qemu_counts(p: &Path) -> (i32, u64, u64) {
    let out = qemu_img_output(&["check", "-U", "--output=json", s(p)]);
    let text = String::from_utf8_lossy(&out.stdout);
    let count = |key: &str| {
        text.find(&format!("\"{key}\":"))
            .map(|i| {
                text[i + key.len() + 3..]
                    .trim_start()
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    };
    (
        out.status.code().unwrap_or(-1),
        count("corruptions"),
        count("leaks"),
    )
}

/// (exit code as ch-img check gives it, corruptions, leaks) of our check.
fn our_counts(p: &Path) -> (i32, u64, u64) {
    match check_image(p, None) {
        Ok(r) => (i32::from(r.exit_code()), r.corruptions, r.leaks),
        Err(_) => (1, 0, 0),
    }
}

fn copy(d: &TempDir, from: &Path, name: &str) -> PathBuf {
    let to = d.join(name);
    std::fs::copy(from, &to).unwrap();
    to
}

fn corrupt_bit(p: &Path) -> bool {
    let b = std::fs::read(p).unwrap();
    be64(&b, 72) & 2 != 0
}

/// A write of guest cluster 0 and a flush through a queue of the image
/// opened read-write (as the VMM opens it). Err: the open, the write or
/// the flush failed.
fn queue_write(p: &Path) -> Result<(), BlockError> {
    let mut o = DiskOptions::new(p);
    o.lock = false;
    let disk = Disk::open(&o)?;
    // In place into guest cluster 0, then one that allocates.
    let r = disk
        .write_at(0, &pattern(7, 4096))
        .and_then(|()| disk.write_at(2 << 20, &pattern(8, 4096)))
        .and_then(|()| disk.flush());
    if r.is_err() {
        // Reads are still served, from the same open disk.
        let mut buf = vec![0u8; 4096];
        disk.read_at(1 << 20, &mut buf)?;
    }
    r
}

fn make(d: &TempDir, c: &Case, i: usize) -> PathBuf {
    let p = d.join(format!("case{i}.qcow2"));
    qemu_create("qcow2", s(&p), "4M", c.opts);
    qemu_io(
        "qcow2",
        &p,
        &["write -P 0x11 0 64k", "write -P 0x22 1M 64k"],
    );
    if c.snapshot {
        run("qemu-img", &["snapshot", "-c", "s1", s(&p)]);
        qemu_io("qcow2", &p, &["write -P 0x33 1M 4k"]);
    }
    let l = layout(&p);
    (c.poke)(&p, &l);
    p
}

#[test]
fn damaged_images_are_never_made_worse_and_are_checked_and_repaired_like_qemu_img() {
    let d = temp_dir("damaged");
    let mut failures = Vec::new();
    println!("| damage | qemu-img check (exit, corruptions, leaks) | ch-img check | qemu-img -r all clean | ch-img -r all clean |");
    println!("| --- | --- | --- | --- | --- |");
    for (i, c) in cases().iter().enumerate() {
        let p = make(&d, c, i);
        let before = qemu_counts(&p);
        let ours = our_counts(&p);
        if ours.0 != before.0 {
            failures.push(format!(
                "{}: our check exits {} (qemu-img {})",
                c.name, ours.0, before.0
            ));
        }

        // A write from a queue never makes it worse.
        let w = copy(&d, &p, "write.qcow2");
        let written = queue_write(&w);
        if c.write_refused {
            let read_refused = matches!(&written, Err(BlockError::InvalidImage { reason, .. })
                if !reason.contains("marked corrupt"))
                || matches!(&written, Err(BlockError::BeyondEndOfFile { .. }));
            if written.is_ok() || !corrupt_bit(&w) || read_refused {
                failures.push(format!(
                    "{}: the write was not refused with the corrupt bit set ({written:?})",
                    c.name
                ));
            }
            match Disk::open(&DiskOptions::new(&w)) {
                Err(e) if e.to_string().contains("ch-img check -r all") => {}
                other => failures.push(format!(
                    "{}: a read-write open of the corrupt image gave {:?}",
                    c.name,
                    other.map(|_| ())
                )),
            }
            let mut ro = DiskOptions::new(&w);
            ro.readonly = true;
            if let Err(e) = Disk::open(&ro) {
                failures.push(format!("{}: read-only open refused: {e}", c.name));
            }
        }
        let after = qemu_counts(&w);
        if c.write_refused {
            // Once repaired, the bit is gone and the image opens
            // read-write; a write is then served or (metadata still
            // overlapping, which qemu-img check does not count) refused
            // again with the bit set, never silently.
            let repaired = check_image(&w, Some(Repair::All));
            if qemu_counts(&w).0 == 0 {
                let cleared = !corrupt_bit(&w);
                let rewritten = queue_write(&w);
                if !cleared || (rewritten.is_err() && !corrupt_bit(&w)) {
                    failures.push(format!(
                        "{}: after check -r all ({repaired:?}): bit cleared {cleared}, write {rewritten:?}",
                        c.name
                    ));
                }
            }
        }
        if after.0 != 0 && (after.1 > before.1 || (after.0 != before.0 && before.0 != 3)) {
            failures.push(format!(
                "{}: qemu-img check after our write {after:?}, before {before:?}",
                c.name
            ));
        }

        // Repairs: qemu-img's on one copy, ours on another.
        let q = copy(&d, &p, "qemu-repaired.qcow2");
        let _ = qemu_img_output(&["check", "-r", "all", s(&q)]);
        let qemu_clean = qemu_counts(&q).0 == 0;
        let r = copy(&d, &p, "ours-repaired.qcow2");
        let repaired = check_image(&r, Some(Repair::All));
        let ours_clean = qemu_counts(&r).0 == 0;
        if qemu_clean && !ours_clean {
            failures.push(format!(
                "{}: qemu-img's repair gets it clean, ours does not ({repaired:?})",
                c.name
            ));
        }
        if qemu_clean && ours_clean && c.qemu_reads() {
            let (ok, out) = run_status("qemu-img", &["compare", "-U", s(&q), s(&r)]);
            if !ok {
                failures.push(format!("{}: repaired copies differ: {out}", c.name));
            }
            // Every readable byte reads as before the repair.
            let (ok, out) = run_status("qemu-img", &["compare", "-U", s(&p), s(&r)]);
            if !ok {
                failures.push(format!("{}: repair changed the contents: {out}", c.name));
            }
            if corrupt_bit(&r) {
                failures.push(format!("{}: -r all left the corrupt bit", c.name));
            }
        }
        println!(
            "| {} | {:?} | {:?} | {} | {} |",
            c.name,
            before,
            ours,
            if qemu_clean { "yes" } else { "no" },
            if ours_clean { "yes" } else { "no" }
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn discards_and_zeroing_never_punch_metadata() {
    let d = temp_dir("damaged-discard");
    for (i, zero) in [false, true].into_iter().enumerate() {
        let p = d.join(format!("d{i}.qcow2"));
        qemu_create("qcow2", s(&p), "4M", "");
        qemu_io("qcow2", &p, &["write -P 0x11 0 64k"]);
        let l = layout(&p);
        poke64(&p, l.l2, l.l1 | COPIED);
        let before = std::fs::read(&p).unwrap();
        let mut o = DiskOptions::new(&p);
        o.lock = false;
        let disk = Disk::open(&o).unwrap();
        let r = if zero {
            disk.write_zeroes(0, 64 << 10, true)
        } else {
            disk.discard(0, 64 << 10)
        };
        assert!(
            r.is_err(),
            "zero={zero}: the plan over the L1 table was not refused"
        );
        drop(disk);
        let after = std::fs::read(&p).unwrap();
        let l1 = l.l1 as usize..(l.l1 + l.cs) as usize;
        assert_eq!(
            before[l1.clone()],
            after[l1],
            "zero={zero}: the L1 table changed"
        );
        assert!(corrupt_bit(&p), "zero={zero}: no corrupt bit");
    }
}
