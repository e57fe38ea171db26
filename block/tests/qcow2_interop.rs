//! qcow2 against qemu-img: images qemu made are read correctly, images we
//! write pass `qemu-img check` and compare equal to a raw reference.

mod support;

use block::create::{create_image, CreateOptions};
use block::options::ImageType;
use support::*;

fn info_json(p: &std::path::Path) -> String {
    run("qemu-img", &["info", "-U", "--output=json", s(p)])
}

#[test]
fn created_images_match_qemu_img_info() {
    let d = temp_dir("create");
    for (name, cs, compat, rb, lazy, ext) in [
        ("default", None, None, None, false, false),
        ("v2", Some(4096), Some("0.10"), None, false, false),
        ("small", Some(512), None, Some(1), false, false),
        ("big", Some(2 << 20), None, Some(64), true, false),
        ("extl2", Some(65536), None, Some(8), false, true),
    ] {
        let p = d.join(name);
        create_image(&CreateOptions {
            path: p.clone(),
            format: ImageType::Format("qcow2"),
            size: 3 << 30,
            cluster_size: cs,
            compat: compat.map(String::from),
            refcount_bits: rb,
            lazy_refcounts: lazy,
            extended_l2: ext,
            ..Default::default()
        })
        .unwrap();
        qemu_check(&p);
        let j = info_json(&p);
        assert!(j.contains("\"virtual-size\": 3221225472"), "{name}: {j}");
        assert!(
            j.contains(&format!("\"cluster-size\": {}", cs.unwrap_or(65536))),
            "{name}: {j}"
        );
        assert!(
            j.contains(&format!("\"compat\": \"{}\"", compat.unwrap_or("1.1"))),
            "{name}: {j}"
        );
        if compat.is_none() {
            assert!(
                j.contains(&format!("\"refcount-bits\": {}", rb.unwrap_or(16))),
                "{name}: {j}"
            );
            assert!(
                j.contains(&format!("\"lazy-refcounts\": {lazy}")),
                "{name}: {j}"
            );
            assert!(
                j.contains(&format!("\"extended-l2\": {ext}")),
                "{name}: {j}"
            );
        }
        let f = open(&p, true);
        let info = f.info();
        assert_eq!(info.virtual_size, 3 << 30);
        assert_eq!(info.cluster_size, Some(cs.unwrap_or(65536)));
        assert_eq!(read(&*f, 0, 4096), vec![0u8; 4096]);
    }
}

#[test]
fn raw_create_and_bad_options() {
    let d = temp_dir("rawcreate");
    let p = d.join("r.raw");
    create_image(&CreateOptions {
        path: p.clone(),
        format: ImageType::RAW,
        size: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 1 << 20);
    let bad = |o: CreateOptions, opt: &str| {
        let e = create_image(&o).unwrap_err().to_string();
        assert!(e.contains(opt), "{e}");
    };
    let base = CreateOptions {
        path: d.join("q"),
        format: ImageType::Format("qcow2"),
        size: 1 << 20,
        ..Default::default()
    };
    bad(
        CreateOptions {
            cluster_size: Some(1000),
            ..base.clone()
        },
        "cluster_size",
    );
    bad(
        CreateOptions {
            refcount_bits: Some(3),
            ..base.clone()
        },
        "refcount_bits",
    );
    bad(
        CreateOptions {
            compat: Some("0.10".into()),
            lazy_refcounts: true,
            ..base.clone()
        },
        "lazy_refcounts",
    );
    bad(
        CreateOptions {
            compat: Some("9".into()),
            ..base.clone()
        },
        "compat",
    );
    bad(
        CreateOptions {
            cluster_size: Some(4096),
            extended_l2: true,
            ..base.clone()
        },
        "extended_l2",
    );
}

#[test]
fn reads_what_qemu_wrote() {
    let d = temp_dir("qemuwrote");
    for (name, opts) in [
        ("v3", "cluster_size=65536"),
        ("v2", "compat=0.10,cluster_size=4096"),
        ("c512", "cluster_size=512,refcount_bits=1"),
    ] {
        let p = d.join(name);
        qemu_create("qcow2", s(&p), "16M", opts);
        run(
            "qemu-io",
            &[
                "-c",
                "write -P 0xab 0 64k",
                "-c",
                "write -P 0xcd 100000 5000",
                "-c",
                "write -z 1M 64k",
                s(&p),
            ],
        );
        let f = open(&p, true);
        assert_eq!(read(&*f, 0, 65536), vec![0xab; 65536], "{name}");
        let got = read(&*f, 99_000, 7000);
        assert_eq!(&got[..1000], &vec![0u8; 1000][..], "{name}");
        assert_eq!(&got[1000..6000], &vec![0xcd; 5000][..], "{name}");
        assert_eq!(&got[6000..], &vec![0u8; 1000][..], "{name}");
        assert_eq!(read(&*f, 1 << 20, 65536), vec![0; 65536], "{name}");
        let st = f.block_status(0, 1 << 20).unwrap();
        assert!(
            st.data && st.present && st.offset.is_some(),
            "{name}: {st:?}"
        );
    }
}

/// Random-ish writes, zeroes and discards against a reference file.
fn exercise(p: &std::path::Path, r: &Reference, size: u64, seed: u64, rounds: usize) {
    let f = open(p, false);
    let mut x = seed;
    for i in 0..rounds {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (x >> 20) % size;
        let len = ((x >> 8) % 200_000).min(size - off).max(1);
        match i % 7 {
            5 => {
                write_zeroes(&*f, off, len, i % 2 == 0);
                r.write(off, &vec![0u8; len as usize]);
            }
            6 => {
                discard(&*f, off, len);
                r.write(off, &vec![0u8; len as usize]);
            }
            _ => {
                let data = pattern(x, len as usize);
                write(&*f, off, &data);
                r.write(off, &data);
            }
        }
        if i % 10 == 9 {
            let o = (x >> 30) % size;
            let l = (size - o).min(300_000) as usize;
            assert_same(&read(&*f, o, l), &r.read(o, l), &format!("round {i}"));
        }
    }
    f.close().unwrap();
}

#[test]
fn writes_pass_qemu_check_and_compare() {
    let d = temp_dir("writes");
    let size = 24u64 << 20;
    for (name, cs, compat, rb) in [
        ("v3-64k", 65536u64, "1.1", 16u32),
        ("v2-4k", 4096, "0.10", 16),
        ("c512-rb64", 512, "1.1", 64),
        ("c512-rb1", 512, "1.1", 1),
        ("c2m-rb8", 2 << 20, "1.1", 8),
    ] {
        let p = d.join(name);
        create_image(&CreateOptions {
            path: p.clone(),
            format: ImageType::Format("qcow2"),
            size,
            cluster_size: Some(cs),
            compat: Some(compat.into()),
            refcount_bits: Some(rb),
            ..Default::default()
        })
        .unwrap();
        let r = Reference::new(d.join(format!("{name}.raw")), size);
        exercise(&p, &r, size, cs + u64::from(rb), 60);
        qemu_verify(&p, &r);
    }
}

#[test]
fn overlay_copies_on_write_from_backing() {
    let d = temp_dir("backing");
    let size = 8u64 << 20;
    for base_fmt in ["qcow2", "raw"] {
        let base = d.join(format!("base.{base_fmt}"));
        qemu_create(base_fmt, s(&base), "6M", "");
        run(
            "qemu-io",
            &["-f", base_fmt, "-c", "write -P 0x11 0 6M", s(&base)],
        );
        let top = d.join(format!("top-{base_fmt}.qcow2"));
        create_image(&CreateOptions {
            path: top.clone(),
            format: ImageType::Format("qcow2"),
            size,
            backing_file: Some(format!("base.{base_fmt}")),
            backing_fmt: Some(if base_fmt == "raw" {
                ImageType::RAW
            } else {
                ImageType::Format("qcow2")
            }),
            ..Default::default()
        })
        .unwrap();
        let r = Reference::new(d.join("ref.raw"), size);
        r.write(0, &vec![0x11; 6 << 20]);
        let f = open(&top, false);
        assert_eq!(
            read(&*f, 6 << 20, 4096),
            vec![0; 4096],
            "past the backing's end"
        );
        assert_eq!(read(&*f, 4096, 4096), vec![0x11; 4096]);
        let data = pattern(1, 3000);
        write(&*f, 70_000, &data);
        r.write(70_000, &data);
        assert_same(&read(&*f, 65536, 65536), &r.read(65536, 65536), "read");
        // Discard over a backing file reads zeroes.
        discard(&*f, 1 << 20, 1 << 20);
        r.write(1 << 20, &vec![0; 1 << 20]);
        assert_eq!(read(&*f, 1 << 20, 4096), vec![0; 4096]);
        let st = f.block_status(3 << 20, 4096).unwrap();
        assert_eq!((st.depth, st.present, st.data), (1, true, true), "{st:?}");
        f.close().unwrap();
        drop(f);
        qemu_verify(&top, &r);
        let j = info_json(&top);
        assert!(
            j.contains(&format!("\"backing-filename-format\": \"{base_fmt}\"")),
            "{j}"
        );
    }
}

#[test]
fn compressed_clusters_read_and_rewrite() {
    let d = temp_dir("compressed");
    let src = d.join("src.raw");
    let r = Reference::new(src.clone(), 4 << 20);
    for i in 0..64u64 {
        r.write(i * 65536, &pattern(i, 30_000));
    }
    for ct in ["zlib", "zstd"] {
        let p = d.join(format!("c-{ct}.qcow2"));
        run(
            "qemu-img",
            &[
                "convert",
                "-c",
                "-O",
                "qcow2",
                "-o",
                &format!("compression_type={ct}"),
                s(&src),
                s(&p),
            ],
        );
        let f = open(&p, false);
        assert_same(&read(&*f, 0, 4 << 20), &r.read(0, 4 << 20), ct);
        let st = f.block_status(0, 65536).unwrap();
        assert!(st.compressed, "{st:?}");
        let r2 = Reference::new(d.join(format!("ref-{ct}.raw")), 4 << 20);
        r2.write(0, &r.read(0, 4 << 20));
        let data = pattern(99, 5000);
        write(&*f, 3 * 65536 + 100, &data);
        r2.write(3 * 65536 + 100, &data);
        discard(&*f, 5 * 65536, 65536);
        r2.write(5 * 65536, &vec![0; 65536]);
        close_and_verify(f, &p, &r2, 4 << 20, ct);
    }
}

#[test]
fn allocation_in_flight_blocks_overlapping_writes() {
    let d = temp_dir("inflight");
    let p = d.join("i.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    let f = open(&p, false);
    let w1 = waker();
    let w2 = waker();
    let block::formats::WriteOutcome::Ready(plan) = f.plan_write(0, 4096, &w1).unwrap() else {
        panic!()
    };
    assert!(plan.commit.is_some());
    assert_eq!(
        f.plan_write(8192, 4096, &w2).unwrap(),
        block::formats::WriteOutcome::Blocked
    );
    // An unrelated cluster is not held up.
    let block::formats::WriteOutcome::Ready(other) = f.plan_write(65536, 512, &w1).unwrap() else {
        panic!()
    };
    // Readers still see the old (unallocated) mapping.
    assert_eq!(read(&*f, 0, 4096), vec![0; 4096]);
    assert!(w2.read().is_err(), "woken too early");
    let data = vec![0x5a; 4096];
    execute(&*f, &plan, &data);
    f.commit(plan.commit.unwrap()).unwrap();
    assert_eq!(w2.read().unwrap(), 1);
    assert_eq!(read(&*f, 0, 4096), data);
    execute(&*f, &other, &[1; 512]);
    f.abort(other.commit.unwrap());
    assert_eq!(
        read(&*f, 65536, 512),
        vec![0; 512],
        "aborted write is not published"
    );
    write(&*f, 8192, &[7; 4096]);
    f.close().unwrap();
    drop(f);
    qemu_check(&p);
}

#[test]
fn locks_are_seen_by_qemu_and_qemu_locks_are_seen_by_us() {
    let d = temp_dir("lock");
    let p = d.join("l.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    let f = open(&p, false);
    let (ok, out) = run_status("qemu-img", &["info", s(&p)]);
    assert!(!ok, "qemu-img info should fail: {out}");
    let (ok, out) = run_status("qemu-io", &["-c", "write 0 4k", s(&p)]);
    assert!(!ok, "qemu-io write should fail: {out}");
    // Re-creating an image in use is refused before anything is truncated.
    let e = create_image(&CreateOptions {
        path: p.clone(),
        format: ImageType::Format("qcow2"),
        size: 1 << 20,
        ..Default::default()
    })
    .unwrap_err();
    assert!(matches!(e, block::BlockError::Locked { .. }), "{e}");
    assert!(std::fs::metadata(&p).unwrap().len() > 0);
    drop(f);
    // qemu-io may find the image still locked for a moment (a child of
    // another test thread can hold a copy of our closed descriptor until
    // it execs): start it again until it holds the image.
    let log = d.join("qemu-io.log");
    let mut child = None;
    for _ in 0..50 {
        let mut c = std::process::Command::new("qemu-io")
            .args(["-c", "sleep 30000", s(&p)])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // Holding the image makes qemu-img info (without -U) fail.
        let started = std::time::Instant::now();
        let held = loop {
            if let Ok(Some(_)) = c.try_wait() {
                break false;
            }
            if started.elapsed() > std::time::Duration::from_secs(30) {
                let _ = c.kill();
                let _ = c.wait();
                panic!("qemu-io neither exited nor locked the image in 30 s");
            }
            if !run_status("qemu-img", &["info", s(&p)]).0 {
                break true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        if held {
            child = Some(c);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let Some(mut child) = child else {
        panic!(
            "qemu-io never locked the image: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };
    let mut o = block::options::DiskOptions::new(&p);
    o.image_type = ImageType::Format("qcow2");
    let r = block::formats::open_format(&o);
    let locked = matches!(r, Err(block::BlockError::Locked { .. }));
    o.readonly = true;
    let locked_ro = matches!(
        block::formats::open_format(&o),
        Err(block::BlockError::Locked { .. })
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(locked, "qemu-io's lock was not seen");
    assert!(
        locked_ro,
        "a reader must not share the image with a qemu writer"
    );
}

#[test]
fn extended_l2_reads_and_writes() {
    let d = temp_dir("extl2");
    let base = d.join("base.raw");
    std::fs::write(&base, vec![0x29u8; 4 << 20]).unwrap();
    for with_backing in [false, true] {
        let p = d.join(format!("e{with_backing}.qcow2"));
        let mut args = vec![
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            "extended_l2=on,cluster_size=64k",
        ];
        if with_backing {
            args.extend(["-b", "base.raw", "-F", "raw"]);
        }
        args.extend([s(&p), "4M"]);
        run("qemu-img", &args);
        run(
            "qemu-io",
            &[
                "-c",
                "write -P 0x42 2048 2048",
                "-c",
                "write -z 8192 2048",
                "-c",
                "write -P 0x43 70000 1000",
                s(&p),
            ],
        );
        let r = Reference::new(d.join("ref.raw"), 4 << 20);
        if with_backing {
            r.write(0, &vec![0x29; 4 << 20]);
        }
        r.write(2048, &[0x42; 2048]);
        r.write(8192, &[0; 2048]);
        r.write(70000, &[0x43; 1000]);
        let f = open(&p, false);
        assert_same(
            &read(&*f, 0, 4 << 20),
            &r.read(0, 4 << 20),
            &format!("qemu's subclusters, backing {with_backing}"),
        );
        for (i, (off, len)) in [
            (100u64, 300usize),
            (2048 + 1024, 4096),
            (65536 * 3 + 5000, 70000),
            (9000, 100),
        ]
        .into_iter()
        .enumerate()
        {
            let data = pattern(i as u64, len);
            write(&*f, off, &data);
            r.write(off, &data);
        }
        write_zeroes(&*f, 65536 * 10 + 512, 3 * 65536, false);
        r.write(65536 * 10 + 512, &vec![0; 3 * 65536]);
        discard(&*f, 65536 * 20, 2 * 65536);
        r.write(65536 * 20, &vec![0; 2 * 65536]);
        close_and_verify(f, &p, &r, 4 << 20, &format!("backing {with_backing}"));
    }
}

#[test]
fn resize_grows_and_lazy_refcounts_mark_dirty() {
    let d = temp_dir("resize");
    let p = d.join("r.qcow2");
    create_image(&CreateOptions {
        path: p.clone(),
        format: ImageType::Format("qcow2"),
        size: 1 << 20,
        cluster_size: Some(512),
        lazy_refcounts: true,
        ..Default::default()
    })
    .unwrap();
    let f = open(&p, false);
    assert_eq!(f.info().dirty, Some(false));
    f.resize(64 << 20).unwrap();
    write(&*f, (64 << 20) - 512, &[9; 512]);
    assert_eq!(f.info().dirty, Some(true));
    assert!(
        f.resize(1000).is_err(),
        "a size not a multiple of 512 is refused"
    );
    f.close().unwrap();
    assert_eq!(f.info().dirty, Some(false));
    drop(f);
    qemu_check(&p);
    assert!(info_json(&p).contains("\"virtual-size\": 67108864"));
    let f = open(&p, true);
    assert_eq!(read(&*f, (64 << 20) - 512, 512), vec![9; 512]);
}

#[test]
fn refcounts_reach_the_file_before_l2_entries() {
    let d = temp_dir("ordering");
    let p = d.join("o.qcow2");
    qemu_create("qcow2", s(&p), "4M", "");
    // Leave a free cluster inside the file (qemu-img check ignores
    // refcounts past the end of the file).
    run(
        "qemu-io",
        &["-c", "write 1M 128k", "-c", "discard 1M 64k", s(&p)],
    );
    let f = open(&p, false);
    let block::formats::WriteOutcome::Ready(plan) = f.plan_write(0, 65536, &waker()).unwrap()
    else {
        panic!()
    };
    // Planned, not committed: the new cluster's refcount waits in the
    // cache (or is on disk: a leak); either way never an error.
    let (_, out) = run_status("qemu-img", &["check", "-U", s(&p)]);
    assert!(!out.contains("ERROR"), "{out}");
    execute(&*f, &plan, &[0x3c; 65536]);
    f.commit(plan.commit.unwrap()).unwrap();
    // Committed: visible to reads at once, on disk after a flush; until
    // then the file holds no reference to the cluster.
    assert_eq!(read(&*f, 0, 65536), vec![0x3c; 65536]);
    let (_, out) = run_status("qemu-img", &["check", "-U", s(&p)]);
    assert!(!out.contains("ERROR"), "{out}");
    f.flush_metadata().unwrap();
    qemu_check(&p);
    let out = run("qemu-io", &["-U", "-r", "-c", "read -P 0x3c 0 64k", s(&p)]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

#[test]
fn plans_have_one_host_write_per_contiguous_extent() {
    use block::formats::{HostWrite, WriteData, WriteOutcome};
    let d = temp_dir("planshape");
    let p = d.join("p.qcow2");
    let base = d.join("b.raw");
    std::fs::write(&base, vec![0x44u8; 1 << 20]).unwrap();
    qemu_create_overlay("qcow2", s(&p), Some("4M"), "", "b.raw", "raw");
    let f = open(&p, false);
    // Three whole clusters, unallocated: one op, request data only.
    let WriteOutcome::Ready(plan) = f.plan_write(65536, 3 * 65536, &waker()).unwrap() else {
        panic!()
    };
    assert_eq!(plan.ops.len(), 1, "{:?}", plan.ops.len());
    let HostWrite::Data { parts, .. } = &plan.ops[0] else {
        panic!()
    };
    assert_eq!(
        parts,
        &vec![WriteData::Request {
            offset: 0,
            len: 3 * 65536
        }]
    );
    execute(&*f, &plan, &vec![0x55; 3 * 65536]);
    f.commit(plan.commit.unwrap()).unwrap();
    // A partial write over the backing: head and tail copied in the same op.
    let WriteOutcome::Ready(plan) = f.plan_write(5 * 65536 + 100, 1000, &waker()).unwrap() else {
        panic!()
    };
    assert_eq!(plan.ops.len(), 1);
    let HostWrite::Data { parts, .. } = &plan.ops[0] else {
        panic!()
    };
    assert_eq!(parts.len(), 3);
    assert!(
        matches!(&parts[0], WriteData::Owned(v) if v.len() == 100 && v.iter().all(|b| *b == 0x44))
    );
    assert_eq!(
        parts[1],
        WriteData::Request {
            offset: 0,
            len: 1000
        }
    );
    assert!(matches!(&parts[2], WriteData::Owned(v) if v.len() == 65536 - 1100));
    f.abort(plan.commit.unwrap());
    // In place into an allocated cluster: no commit.
    let WriteOutcome::Ready(plan) = f.plan_write(65536 + 10, 10, &waker()).unwrap() else {
        panic!()
    };
    assert!(plan.commit.is_none());
    // Discard of allocated clusters: the L2 entries change now, the punch
    // is the engine's, the refcount drop waits for commit.
    let WriteOutcome::Ready(plan) = f.plan_discard(65536, 2 * 65536, &waker()).unwrap() else {
        panic!()
    };
    assert!(
        matches!(plan.ops[..], [HostWrite::PunchHole { len: 131072, .. }]),
        "{:?}",
        plan.ops
    );
    assert!(plan.commit.is_some());
    f.commit(plan.commit.unwrap()).unwrap();
    assert_eq!(read(&*f, 65536, 2 * 65536), vec![0; 2 * 65536]);
    f.close().unwrap();
    drop(f);
    qemu_check(&p);
}

/// One line of `qemu-img map --output=json`.
#[derive(Debug)]
struct MapEntry {
    start: u64,
    length: u64,
    depth: u32,
    present: bool,
    zero: bool,
    data: bool,
    offset: Option<u64>,
}

fn parse_map(json: &str) -> Vec<MapEntry> {
    let field = |line: &str, key: &str| -> Option<String> {
        let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
        Some(
            line[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect(),
        )
    };
    json.lines()
        .filter(|l| l.contains("\"start\""))
        .map(|l| MapEntry {
            start: field(l, "start").unwrap().parse().unwrap(),
            length: field(l, "length").unwrap().parse().unwrap(),
            depth: field(l, "depth").unwrap().parse().unwrap(),
            present: field(l, "present").unwrap() == "true",
            zero: field(l, "zero").unwrap() == "true",
            data: field(l, "data").unwrap() == "true",
            offset: field(l, "offset").map(|o| o.parse().unwrap()),
        })
        .collect()
}

#[test]
fn block_status_matches_qemu_img_map() {
    let d = temp_dir("map");
    let base = d.join("base.qcow2");
    qemu_create("qcow2", s(&base), "2M", "");
    run("qemu-io", &["-c", "write -P 1 0 1M", s(&base)]);
    let top = d.join("top.qcow2");
    qemu_create_overlay("qcow2", s(&top), Some("4M"), "", "base.qcow2", "qcow2");
    run(
        "qemu-io",
        &[
            "-c",
            "write -P 2 64k 128k",
            "-c",
            "write -z 512k 64k",
            "-c",
            "write -P 3 3M 4k",
            s(&top),
        ],
    );
    let map = parse_map(&run("qemu-img", &["map", "-U", "--output=json", s(&top)]));
    assert!(map.len() >= 5, "{map:?}");
    let f = open(&top, true);
    for e in &map {
        let mut pos = e.start;
        while pos < e.start + e.length {
            let st = f.block_status(pos, e.start + e.length - pos).unwrap();
            assert_eq!(
                (st.depth, st.present, st.zero, st.data),
                (e.depth, e.present, e.zero, e.data),
                "at {pos}: {e:?} vs {st:?}"
            );
            if let Some(o) = e.offset {
                assert_eq!(st.offset, Some(o + pos - e.start), "at {pos}: {e:?}");
            }
            pos += st.len;
        }
    }
}

#[test]
fn backing_files_are_locked_shared() {
    let d = temp_dir("locksh");
    let base = d.join("base.qcow2");
    qemu_create("qcow2", s(&base), "4M", "");
    let top = d.join("top.qcow2");
    qemu_create_overlay("qcow2", s(&top), None, "", "base.qcow2", "qcow2");
    let f = open(&top, false);
    // Readers of the backing file are welcome, writers are not.
    run("qemu-io", &["-r", "-c", "read 0 4k", s(&base)]);
    let second = open(&d.join("base.qcow2"), true);
    drop(second);
    let (ok, out) = run_status("qemu-io", &["-c", "write 0 4k", s(&base)]);
    assert!(!ok, "a qemu writer got the backing file: {out}");
    drop(f);
    // Retry: a child of another test thread may briefly hold our closed
    // descriptor's lock (between its fork and exec).
    let released = (0..100).any(|_| {
        let ok = run_status("qemu-io", &["-c", "write 0 4k", s(&base)]).0;
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        ok
    });
    assert!(released, "the backing file stayed locked after close");
}

/// A write into an allocated extended-L2 cluster allocates only the
/// subclusters it touches (their uncovered parts copied from the backing
/// file); the others keep showing the backing data, as qemu-img map sees.
#[test]
fn extended_l2_writes_allocate_only_touched_subclusters() {
    let d = temp_dir("extl2sub");
    let base = d.join("base.raw");
    std::fs::write(&base, pattern(9, 1 << 20)).unwrap();
    let p = d.join("o.qcow2");
    qemu_create_overlay(
        "qcow2",
        s(&p),
        Some("1M"),
        "extended_l2=on,cluster_size=64k",
        "base.raw",
        "raw",
    );
    // Subcluster 0 (2 KiB each) allocated by qemu, 2 zeroed.
    run(
        "qemu-io",
        &[
            "-c",
            "write -P 0x42 0 2048",
            "-c",
            "write -z 4096 2048",
            s(&p),
        ],
    );
    let r = Reference::new(d.join("ref.raw"), 1 << 20);
    r.write(0, &pattern(9, 1 << 20));
    r.write(0, &[0x42; 2048]);
    r.write(4096, &[0; 2048]);
    let f = open(&p, false);
    // Parts of subclusters 2, 3 and 5..=6 (1 KiB into 5, to 512 into 6),
    // and part of allocated subcluster 0.
    for (off, len) in [
        (4096u64 + 512, 3000usize),
        (5 * 2048 + 1024, 1536),
        (100, 200),
    ] {
        let data = pattern(off, len);
        write(&*f, off, &data);
        r.write(off, &data);
    }
    close_and_verify(f, &p, &r, 1 << 20, "read back");
    let map = run("qemu-img", &["map", "--output=json", s(&p)]);
    // Subcluster 1 (2048..4096) and 4 (8192..10240) still come from the
    // backing file (depth 1); the whole-cluster copy would allocate them.
    let from_backing = |start: u64, end: u64| {
        map.lines().any(|l| {
            let num = |k: &str| {
                l.split(&format!("\"{k}\": "))
                    .nth(1)
                    .and_then(|v| v.split([',', '}']).next())
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            match (num("start"), num("length"), num("depth")) {
                (Some(s), Some(n), Some(1)) => s <= start && end <= s + n,
                _ => false,
            }
        })
    };
    assert!(from_backing(2048, 4096), "{map}");
    assert!(from_backing(8192, 10240), "{map}");
    assert!(from_backing(7 * 2048, 65536), "{map}");
    assert!(!from_backing(4096, 8192), "{map}");
}
