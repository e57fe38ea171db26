//! qcow2 features beyond plain reads and writes: internal snapshots
//! (refcount > 1), refcount table growth, external data files, v2 images
//! over a backing file, and hostile or unusual images refused by name.

mod support;

use std::os::unix::fs::FileExt;

use block::create::{create_image, CreateOptions};
use block::options::{DiskOptions, ImageType};
use block::BlockError;
use support::*;

fn open_err(p: &std::path::Path, readonly: bool) -> BlockError {
    let mut o = DiskOptions::new(p);
    o.readonly = readonly;
    // Locks are tested elsewhere; here they could only add noise.
    o.lock = false;
    match block::formats::open_format(&o) {
        Ok(_) => panic!("{} opened", p.display()),
        Err(e) => e,
    }
}

fn patch(p: &std::path::Path, off: u64, bytes: &[u8]) {
    let f = std::fs::File::options().write(true).open(p).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

#[test]
fn writes_after_internal_snapshot_copy_shared_clusters() {
    let d = temp_dir("snap");
    let p = d.join("s.qcow2");
    qemu_create("qcow2", s(&p), "8M", "");
    run("qemu-io", &["-c", "write -P 0x31 0 1M", s(&p)]);
    run("qemu-img", &["snapshot", "-c", "snap1", s(&p)]);
    let r = Reference::new(d.join("ref.raw"), 8 << 20);
    r.write(0, &vec![0x31; 1 << 20]);
    let f = open(&p, false);
    let data = pattern(5, 10_000);
    write(&*f, 30_000, &data);
    r.write(30_000, &data);
    write(&*f, 4 << 20, &data);
    r.write(4 << 20, &data);
    discard(&*f, 512 << 10, 128 << 10);
    r.write(512 << 10, &vec![0; 128 << 10]);
    close_and_verify(f, &p, &r, 8 << 20, "read");
    // The snapshot still holds the old data.
    let snap = d.join("snap.raw");
    run(
        "qemu-img",
        &["convert", "-l", "snap1", "-O", "raw", s(&p), s(&snap)],
    );
    let mut want = vec![0u8; 8 << 20];
    want[..1 << 20].fill(0x31);
    assert_eq!(std::fs::read(&snap).unwrap(), want);
}

#[test]
fn refcount_table_grows_when_full() {
    let d = temp_dir("rtgrow");
    let p = d.join("g.qcow2");
    // 512-byte clusters, 64-bit refcounts: one refcount block covers 64
    // clusters and the one-cluster table covers 2 MiB of file.
    qemu_create("qcow2", s(&p), "8M", "cluster_size=512,refcount_bits=64");
    let before = std::fs::read(&p).unwrap()[56..60].to_vec();
    let r = Reference::new(d.join("ref.raw"), 8 << 20);
    let f = open(&p, false);
    let data = pattern(3, 6 << 20);
    write(&*f, 1 << 20, &data);
    r.write(1 << 20, &data);
    drop(f);
    let after = std::fs::read(&p).unwrap()[56..60].to_vec();
    assert_ne!(before, after, "refcount_table_clusters did not change");
    qemu_verify(&p, &r);
}

#[test]
fn external_data_file_reads_and_writes() {
    let d = temp_dir("datafile");
    for raw in [false, true] {
        let p = d.join(format!("x{raw}.qcow2"));
        let data = d.join(format!("x{raw}.data"));
        let o = format!(
            "data_file={},data_file_raw={}",
            s(&data),
            if raw { "on" } else { "off" }
        );
        qemu_create("qcow2", s(&p), "4M", &o);
        run(
            "qemu-io",
            &[
                "-c",
                "write -P 0x66 64k 64k",
                "-c",
                "write -P 0x67 3M 4k",
                s(&p),
            ],
        );
        let r = Reference::new(d.join("ref.raw"), 4 << 20);
        r.write(65536, &[0x66; 65536]);
        r.write(3 << 20, &[0x67; 4096]);
        let f = open(&p, false);
        assert_eq!(f.files().len(), 2);
        assert_same(&read(&*f, 0, 4 << 20), &r.read(0, 4 << 20), "read");
        for (i, (off, len)) in [(100u64, 5000usize), (65536 + 10, 100), (2 << 20, 200_000)]
            .into_iter()
            .enumerate()
        {
            let buf = pattern(i as u64 + 7, len);
            write(&*f, off, &buf);
            r.write(off, &buf);
        }
        discard(&*f, 65536, 65536);
        r.write(65536, &[0; 65536]);
        write_zeroes(&*f, 3 << 20, 65536, false);
        r.write(3 << 20, &[0; 65536]);
        close_and_verify(f, &p, &r, 4 << 20, "read");
        if raw {
            // The data file stays a usable raw image of the disk.
            let mut bytes = std::fs::read(&data).unwrap();
            bytes.resize(4 << 20, 0);
            assert_same(&bytes, &r.read(0, 4 << 20), "raw data file");
        }
    }
}

#[test]
fn v2_discard_over_backing_reads_zero() {
    let d = temp_dir("v2backing");
    let base = d.join("base.raw");
    std::fs::write(&base, vec![0x77u8; 1 << 20]).unwrap();
    let top = d.join("top.qcow2");
    qemu_create_overlay("qcow2", s(&top), None, "compat=0.10", "base.raw", "raw");
    let f = open(&top, false);
    discard(&*f, 65536, 131072);
    write_zeroes(&*f, 300_000, 1000, true);
    let got = read(&*f, 0, 1 << 20);
    let mut want = vec![0x77u8; 1 << 20];
    want[65536..196608].fill(0);
    want[300_000..301_000].fill(0);
    assert_eq!(got, want);
    drop(f);
    qemu_check(&top);
}

#[test]
fn hostile_headers_are_refused_by_name() {
    let d = temp_dir("hostile");
    let mk = |name: &str| {
        let p = d.join(name);
        qemu_create("qcow2", s(&p), "1G", "");
        p
    };
    let p = mk("l1.qcow2");
    patch(&p, 40, &(1u64 << 40).to_be_bytes());
    assert!(open_err(&p, true)
        .to_string()
        .contains("L1 table lies beyond"));
    let p = mk("rt.qcow2");
    patch(&p, 48, &0u64.to_be_bytes());
    assert!(open_err(&p, true)
        .to_string()
        .contains("overlapping the header"));
    let p = mk("l1size.qcow2");
    patch(&p, 36, &u32::MAX.to_be_bytes());
    assert!(open_err(&p, true).to_string().contains("absurd"));
    let p = mk("bits.qcow2");
    patch(&p, 20, &40u32.to_be_bytes());
    assert!(open_err(&p, true).to_string().contains("cluster_bits"));
    let p = mk("incompat.qcow2");
    patch(&p, 72, &(1u64 << 17).to_be_bytes());
    let e = open_err(&p, true);
    assert!(
        e.is_unsupported() && e.to_string().contains("bit 17"),
        "{e}"
    );
    let p = mk("crypt.qcow2");
    patch(&p, 32, &1u32.to_be_bytes());
    assert!(open_err(&p, true).to_string().contains("encryption"));
    let p = d.join("short.qcow2");
    std::fs::write(&p, b"QFI\xfb\0\0\0\x03").unwrap();
    assert!(open_err(&p, true).to_string().contains("truncated"));
    // An L2 table pointer past the end of the file.
    let p = mk("l2.qcow2");
    let l1 = u64::from_be_bytes(std::fs::read(&p).unwrap()[40..48].try_into().unwrap());
    patch(&p, l1, &((1u64 << 50) | (1 << 63)).to_be_bytes());
    let f = open(&p, true);
    let mut plan = Vec::new();
    let e = f.plan_read(0, 512, &mut plan).unwrap_err();
    assert!(
        matches!(e, BlockError::BeyondEndOfFile { guest: 0, .. })
            && e.to_string().contains("beyond the end of the file"),
        "{e}"
    );
    // A data cluster entry that points at the L1 table is not written.
    let p = mk("overlap.qcow2");
    run("qemu-io", &["-c", "write 0 4k", s(&p)]);
    let raw = std::fs::read(&p).unwrap();
    let l1 = u64::from_be_bytes(raw[40..48].try_into().unwrap());
    let l2 = u64::from_be_bytes(raw[l1 as usize..l1 as usize + 8].try_into().unwrap())
        & 0x00ff_ffff_ffff_fe00;
    patch(&p, l2, &(l1 | (1 << 63)).to_be_bytes());
    let f = open(&p, false);
    let e = f.plan_write(0, 512, &waker()).unwrap_err();
    assert!(e.to_string().contains("overlaps the L1 table"), "{e}");
    // The refusal marked the image corrupt (incompatible feature bit 1).
    let incompat = u64::from_be_bytes(std::fs::read(&p).unwrap()[72..80].try_into().unwrap());
    assert_eq!(incompat & 2, 2, "corrupt bit after the refused write");
}

#[test]
fn dirty_images_are_repaired_read_write_and_corrupt_ones_open_read_only_only() {
    let d = temp_dir("dirty");
    let p = d.join("d.qcow2");
    qemu_create("qcow2", s(&p), "4M", "lazy_refcounts=on");
    patch(&p, 72, &1u64.to_be_bytes());
    // Read-only: opens without repairing (the bit stays set).
    drop(open(&p, true));
    assert_eq!(incompatible_bits(&p), 1);
    // Read-write: the refcounts are rebuilt and the bit cleared.
    drop(open(&p, false));
    assert_eq!(incompatible_bits(&p), 0);
    patch(&p, 72, &2u64.to_be_bytes());
    assert!(open_err(&p, false).to_string().contains("corrupt"));
    drop(open(&p, true));
}

fn incompatible_bits(p: &std::path::Path) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(p)
        .unwrap()
        .read_exact_at(&mut b, 72)
        .unwrap();
    u64::from_be_bytes(b)
}

/// qemu-io killed mid-run leaves a lazy-refcounts image dirty (refcounts
/// possibly never written); a read-write open repairs it, and writes on
/// top of it keep the image consistent.
#[test]
fn image_left_dirty_by_a_killed_qemu_is_repaired_on_read_write_open() {
    let d = temp_dir("crashdirty");
    let p = d.join("d.qcow2");
    qemu_create("qcow2", s(&p), "8M", "lazy_refcounts=on");
    // qemu-io exits by SIGKILL, so only its status differs from `run`.
    let _ = run_status(
        "qemu-io",
        &["-c", "write -P 0x11 0 1M", "-c", "sigraise 9", s(&p)],
    );
    assert_eq!(incompatible_bits(&p) & 1, 1, "qemu-io left the image clean");
    // Its refcounts are really missing (qemu-img check does not repair).
    let (clean, out) = run_status("qemu-img", &["check", s(&p)]);
    assert!(!clean && out.contains("refcount=0"), "{out}");
    let r = Reference::new(d.join("ref.raw"), 8 << 20);
    r.write(0, &vec![0x11; 1 << 20]);
    // Read-only opens work and leave the image as it is.
    let f = open(&p, true);
    assert_same(
        &read(&*f, 0, 2 << 20),
        &r.read(0, 2 << 20),
        "read-only read",
    );
    drop(f);
    assert_eq!(incompatible_bits(&p) & 1, 1);
    let f = open(&p, false);
    let data = pattern(7, 300_000);
    write(&*f, 700_000, &data);
    r.write(700_000, &data);
    write(&*f, 3 << 20, &data);
    r.write(3 << 20, &data);
    assert_same(&read(&*f, 0, 8 << 20), &r.read(0, 8 << 20), "read");
    f.close().unwrap();
    drop(f);
    assert_eq!(incompatible_bits(&p), 0);
    qemu_verify(&p, &r);
}

#[test]
fn backing_chain_errors() {
    let d = temp_dir("chain");
    let mkq = |name: &str, backing: &str| {
        let p = d.join(name);
        create_image(&CreateOptions {
            path: p.clone(),
            format: ImageType::Format("qcow2"),
            size: 1 << 20,
            ..Default::default()
        })
        .unwrap();
        // Point at the backing file by editing the header: creating
        // through qemu-img would refuse the cycles we want to test.
        if !backing.is_empty() {
            let off = 112u64 + 8; // after the end-of-extensions marker
            patch(&p, 8, &off.to_be_bytes());
            patch(&p, 16, &(backing.len() as u32).to_be_bytes());
            patch(&p, off, backing.as_bytes());
        }
        p
    };
    let a = mkq("a.qcow2", "b.qcow2");
    mkq("b.qcow2", "a.qcow2");
    assert!(open_err(&a, true).to_string().contains("cycle"));
    std::fs::create_dir(d.join("dir")).unwrap();
    let c = mkq("c.qcow2", "dir");
    assert!(open_err(&c, true).to_string().contains("directory"));
    // A chain of 20 images is deeper than we follow.
    mkq("n0.qcow2", "");
    for i in 1..20 {
        mkq(&format!("n{i}.qcow2"), &format!("n{}.qcow2", i - 1));
    }
    assert!(open_err(&d.join("n19.qcow2"), true)
        .to_string()
        .contains("deeper"));
    let ok = open(&d.join("n10.qcow2"), true);
    assert_eq!(read(&*ok, 0, 512), vec![0; 512]);
}

#[test]
fn unknown_autoclear_bits_are_cleared_on_read_write_open() {
    let d = temp_dir("autoclear");
    let p = d.join("a.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    patch(&p, 88, &((1u64 << 7) | 1).to_be_bytes());
    drop(open(&p, true));
    let autoclear = |p: &std::path::Path| {
        u64::from_be_bytes(std::fs::read(p).unwrap()[88..96].try_into().unwrap())
    };
    assert_eq!(
        autoclear(&p),
        (1 << 7) | 1,
        "a read-only open changes nothing"
    );
    drop(open(&p, false));
    assert_eq!(autoclear(&p), 0, "bitmaps (bit 0) and unknown bits cleared");
    qemu_check(&p);
}

#[test]
fn overlay_size_comes_from_the_backing_image() {
    let d = temp_dir("sizefrombacking");
    std::fs::write(d.join("base.raw"), vec![0u8; 3 << 20]).unwrap();
    let top = d.join("top.qcow2");
    create_image(&CreateOptions {
        path: top.clone(),
        format: ImageType::Format("qcow2"),
        size: 0,
        backing_file: Some("base.raw".into()),
        backing_fmt: Some(ImageType::RAW),
        ..Default::default()
    })
    .unwrap();
    let out = run("qemu-img", &["info", "-U", "--output=json", s(&top)]);
    assert!(out.contains("\"virtual-size\": 3145728"), "{out}");
    assert!(out.contains("\"backing-filename\": \"base.raw\""), "{out}");
    qemu_check(&top);
    // A backing file that does not exist is refused at creation.
    let e = create_image(&CreateOptions {
        path: d.join("bad.qcow2"),
        format: ImageType::Format("qcow2"),
        backing_file: Some("missing.raw".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("backing_file"), "{e}");
}

/// Allocating writes find the file already long enough (no extending
/// direct writes); close cuts the unused tail, and a tail left by a crash
/// is harmless to qemu-img and to us.
#[test]
fn file_size_runs_ahead_of_allocation_and_is_trimmed_on_close() {
    let d = temp_dir("reserve");
    let p = d.join("r.qcow2");
    qemu_create("qcow2", s(&p), "64M", "");
    let r = Reference::new(d.join("ref.raw"), 64 << 20);
    let len = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    let f = open(&p, false);
    let data = pattern(3, 1 << 20);
    write(&*f, 0, &data);
    r.write(0, &data);
    assert!(len(&p) > 4 << 20, "file not grown ahead: {}", len(&p));
    f.close().unwrap();
    drop(f);
    let end = qemu_end_offset(&p);
    assert_eq!(len(&p), end, "tail not trimmed on close");
    qemu_verify(&p, &r);
    // A "crash": no close, no drop; the tail stays.
    let f = open(&p, false);
    write(&*f, 8 << 20, &data);
    r.write(8 << 20, &data);
    f.flush_metadata().unwrap();
    std::mem::forget(f);
    assert!(len(&p) > qemu_end_offset(&p));
    qemu_verify(&p, &r);
    // The forgotten handle still holds its lock (as a dead process's
    // would not): reopen without locking.
    let mut o = DiskOptions::new(&p);
    o.lock = false;
    let f = block::formats::open_format(&o).unwrap();
    write(&*f, 16 << 20, &data);
    r.write(16 << 20, &data);
    f.close().unwrap();
    drop(f);
    qemu_verify(&p, &r);
}

fn qemu_end_offset(p: &std::path::Path) -> u64 {
    let out = run("qemu-img", &["check", "-U", s(p)]);
    out.lines()
        .find_map(|l| l.strip_prefix("Image end offset: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no end offset in {out}"))
}

/// Clusters smaller than a page: metadata (written buffered) and guest
/// data (written with O_DIRECT) would share pages, which Linux answers
/// with EIO and possibly stale write-back (docs/qcow2.md). Such an open is
/// refused by name; buffered and read-only direct opens still work.
#[test]
fn direct_writes_to_sub_page_clusters_are_refused() {
    let d = temp_dir("subpage-direct");
    let p = d.join("small.qcow2");
    create_image(&CreateOptions {
        path: p.clone(),
        format: ImageType::Format("qcow2"),
        size: 1 << 20,
        cluster_size: Some(512),
        ..Default::default()
    })
    .unwrap();
    let open = |direct: bool, readonly: bool| {
        let mut o = DiskOptions::new(&p);
        o.direct = direct;
        o.readonly = readonly;
        // A child forked by another test thread while an open held the
        // lock keeps it until its exec; locks are tested elsewhere.
        o.lock = false;
        block::formats::open_format(&o).map(|_| ())
    };
    let err = open(true, false).expect_err("a direct writable open of 512-byte clusters");
    let msg = err.to_string();
    assert!(
        msg.contains("512-byte clusters") && msg.contains("O_DIRECT"),
        "{msg}"
    );
    open(true, true).expect("a direct read-only open");
    open(false, false).expect("a buffered writable open");

    // 4 KiB clusters fill a page each: direct writes are fine.
    let q = d.join("page.qcow2");
    create_image(&CreateOptions {
        path: q.clone(),
        format: ImageType::Format("qcow2"),
        size: 1 << 20,
        cluster_size: Some(4096),
        ..Default::default()
    })
    .unwrap();
    let mut o = DiskOptions::new(&q);
    o.direct = true;
    block::formats::open_format(&o).expect("a direct open of 4 KiB clusters");
}
