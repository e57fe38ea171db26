//! ch-img's cache modes, parallel convert, progress, help and ENOSPC,
//! against qemu-img's behaviour: O_DIRECT outputs leave no page cache,
//! every worker count gives the same output, errors read like qemu-img's.

use std::process::{Command, Stdio};

use integration_tests::{ch, ch_img, ch_status, json, qemu_img, qemu_img_status, qemu_io, TempDir};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A source of `mib` MiB: compressible text, random bytes, zeroes and
/// ones in turn, 256 KiB each, and an odd tail.
fn mixed_source(dir: &TempDir, mib: usize) -> String {
    let path = dir.file("src.raw");
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut data = Vec::with_capacity(mib << 20);
    let text: Vec<u8> = (0..20000)
        .flat_map(|i| format!("line {i}: a compressible sentence\n").into_bytes())
        .collect();
    for i in 0..mib * 4 {
        let mut part = vec![0u8; 256 << 10];
        match i % 4 {
            0 => part.copy_from_slice(&text[..256 << 10]),
            1 => part.iter_mut().for_each(|b| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                *b = rng as u8;
            }),
            2 => {}
            _ => part.fill(1),
        }
        data.extend_from_slice(&part);
    }
    data.extend_from_slice(b"tail of an odd size");
    std::fs::write(&path, &data).unwrap();
    path
}

/// Bytes of `path` in the page cache (fincore, from util-linux).
fn resident_bytes(path: &str) -> u64 {
    let out = testkit::output_within(
        Command::new("fincore").args(["--bytes", "--noheadings", "--output", "RES", path]),
        testkit::COMMAND_LIMIT,
    );
    assert!(out.status.success(), "fincore {path}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("fincore output: {e}"))
}

#[test]
fn convert_with_cache_none_leaves_no_page_cache() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 16);
    for compress in [true, false] {
        for (mode, expect_cached) in [("none", false), ("writeback", true)] {
            let out = dir.file(&format!("out-{mode}-{compress}.qcow2"));
            let mut args = vec!["convert", "-O", "qcow2", "-t", mode];
            if compress {
                args.push("-c");
            }
            args.extend([src.as_str(), out.as_str()]);
            ch(&args);
            // Measured before qemu-img reads the file (into the page cache).
            let size = std::fs::metadata(&out).unwrap().len();
            let resident = resident_bytes(&out);
            qemu_img(&["check", &out]);
            qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &src, &out]);
            if expect_cached {
                assert!(
                    resident > size / 2,
                    "-t {mode} -c={compress}: only {resident} of {size} bytes cached"
                );
            } else {
                // Only metadata (header, tables) goes through the page cache.
                assert!(
                    resident < size / 10,
                    "-t {mode} -c={compress}: {resident} of {size} bytes cached"
                );
            }
        }
    }
}

#[test]
fn every_cache_mode_gives_the_same_compressed_image() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 4);
    let reference = dir.file("ref.qcow2");
    ch(&["convert", "-c", "-O", "qcow2", "-m", "1", &src, &reference]);
    for mode in [
        "none",
        "off",
        "writeback",
        "writethrough",
        "directsync",
        "unsafe",
    ] {
        let out = dir.file("out.qcow2");
        ch(&[
            "convert", "-c", "-O", "qcow2", "-t", mode, "-T", mode, &src, &out,
        ]);
        qemu_img(&["check", &out]);
        qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &src, &out]);
        let a = json(&qemu_img(&["map", "--output=json", &reference]));
        let b = json(&qemu_img(&["map", "--output=json", &out]));
        assert_eq!(a, b, "-t {mode}: layout differs from the serial run");
    }
    // The cache's size changes when host clusters are written, not where.
    for cache in ["--compressed-cache=0", "--compressed-cache=1"] {
        for mode in ["none", "writeback"] {
            let out = dir.file("out.qcow2");
            ch(&[
                "convert", "-c", "-O", "qcow2", "-t", mode, cache, &src, &out,
            ]);
            qemu_img(&["check", &out]);
            qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &src, &out]);
            let a = json(&qemu_img(&["map", "--output=json", &reference]));
            let b = json(&qemu_img(&["map", "--output=json", &out]));
            assert_eq!(
                a, b,
                "-t {mode} {cache}: layout differs from the serial run"
            );
        }
    }
    // The O_DIRECT output reads back through our own read path too.
    let back = dir.file("back.raw");
    ch(&[
        "convert", "-T", "none", "-t", "none", "-O", "raw", &reference, &back,
    ]);
    qemu_img(&["compare", "-f", "raw", "-F", "raw", &src, &back]);
}

#[test]
fn parallel_convert_equals_serial() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 8);
    for (opts, compress) in [
        ("compression_type=zlib", true),
        ("compression_type=zstd", true),
        ("cluster_size=4096", true),
        ("cluster_size=65536", false),
    ] {
        let serial = dir.file("serial.qcow2");
        let mut base = vec!["convert", "-O", "qcow2", "-o", opts];
        if compress {
            base.push("-c");
        }
        let run = |out: &str, extra: &[&str]| {
            let mut args = base.clone();
            args.extend_from_slice(extra);
            args.extend([src.as_str(), out]);
            ch(&args);
            qemu_img(&["check", out]);
            qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &src, out]);
        };
        run(&serial, &["-m", "1"]);
        for extra in [
            &["-m", "8"][..],
            &["-m", "16", "-W"],
            &["-m", "3", "-t", "none"],
        ] {
            let out = dir.file("par.qcow2");
            run(&out, extra);
            // -W lays clusters out in another order: qemu-img compare -s
            // then sees other extents, so only in-order runs are strict.
            if !extra.contains(&"-W") {
                qemu_img(&["compare", "-s", &serial, &out]);
            }
            // In layout order (-c always; in-order writes too, which
            // allocate in the writer's order even while several are in
            // flight): the very same file.
            if compress || !extra.contains(&"-W") {
                integration_tests::assert_same_bytes(&serial, &out);
            }
        }
    }
}

/// Data runs that share clusters (per 128 KiB: 0..4K, and 60K..68K across
/// the next cluster's start; separate runs with `-S 4096`): the second run
/// waits for the first's allocation, and the writes in flight never let
/// the next run (the next cluster pair) allocate before it, so every run
/// lays the image out the same, with O_DIRECT and without.
#[test]
fn writes_in_flight_keep_the_layout_when_runs_share_clusters() {
    let dir = TempDir::new("cache");
    let src = dir.file("sparse.raw");
    let mut data = vec![0u8; 6 << 20];
    for (i, pair) in data.chunks_mut(128 << 10).enumerate() {
        pair[..4 << 10].fill(i as u8 | 1);
        pair[60 << 10..68 << 10].fill(i as u8 | 2);
    }
    std::fs::write(&src, &data).unwrap();
    let serial = dir.file("serial.qcow2");
    let base = ["convert", "-O", "qcow2", "-S", "4096"];
    let run = |out: &str, extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args.extend([src.as_str(), out]);
        ch(&args);
        qemu_img(&["check", out]);
        qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &src, out]);
    };
    run(&serial, &["-m", "1", "-t", "writeback"]);
    for extra in [
        &["-m", "8", "-t", "none"][..],
        &["-m", "4", "-t", "writeback"],
    ] {
        let out = dir.file("par.qcow2");
        run(&out, extra);
        integration_tests::assert_same_bytes(&serial, &out);
    }
}

/// Exit status and message of the same bad command line for both tools.
fn same_error(args: &[&str]) {
    let ours = ch_status(args);
    let theirs = qemu_img_status(args);
    assert_eq!(ours.status.code(), theirs.status.code(), "{args:?}");
    let want = stderr(&theirs).replace("qemu-img:", "ch-img:");
    let want = want.lines().next().unwrap_or_default();
    assert!(
        stderr(&ours).starts_with(want),
        "{args:?}: ours {:?}, qemu-img's {want:?}",
        stderr(&ours)
    );
}

#[test]
fn bad_cache_modes_and_worker_counts_fail_like_qemu_img() {
    let dir = TempDir::new("cache");
    let img = dir.file("img.qcow2");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "1M"]);
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", &base, "-F", "qcow2", &img,
    ]);
    let out = dir.file("out.qcow2");
    for args in [
        &["convert", "-t", "bogus", "-O", "qcow2", &img, &out][..],
        &["convert", "-T", "bogus", "-O", "qcow2", &img, &out],
        &["convert", "-m", "0", "-O", "qcow2", &img, &out],
        &["convert", "-m", "17", "-O", "qcow2", &img, &out],
        &["convert", "-m", "x", "-O", "qcow2", &img, &out],
        &["commit", "-t", "bogus", &img],
        &["rebase", "-t", "bogus", "-u", "-b", "", &img],
        &["rebase", "-T", "bogus", "-u", "-b", "", &img],
        &["check", "-T", "bogus", &img],
        &["compare", "-T", "bogus", &img, &img],
        &["bench", "-t", "bogus", &img],
    ] {
        same_error(args);
    }
    // qemu-img 7.2 accepts -W with -c; so do we.
    ch(&["convert", "-W", "-c", "-O", "qcow2", &img, &out]);
    qemu_img(&["convert", "-W", "-c", "-O", "qcow2", &img, &out]);
}

/// fdatasync calls of `ch-img ARGS` (strace; the sync engine makes them
/// system calls).
fn fdatasyncs(args: &[&str]) -> u64 {
    syscalls("fdatasync", args)
}

/// Calls of system call `name` by `ch-img ARGS` (strace -c).
fn syscalls(name: &str, args: &[&str]) -> u64 {
    let log = TempDir::new("strace");
    let file = log.file("trace");
    let out = testkit::output_within(
        Command::new("strace")
            .args(["-f", "-c", "-e", &format!("trace={name}"), "-o", &file])
            .arg(ch_img())
            .args(args),
        testkit::COMMAND_LIMIT,
    );
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let text = std::fs::read_to_string(&file).unwrap();
    text.lines()
        .find(|l| l.trim_end().ends_with(name))
        .and_then(|l| l.split_whitespace().nth(3))
        .map_or(0, |n| n.parse().unwrap())
}

/// A worker reuses its chunk buffer: the holes of a raw source must read
/// as zeroes, not as the bytes an earlier chunk left there.
#[test]
fn convert_zeroes_holes_in_reused_chunk_buffers() {
    let dir = TempDir::new("cache");
    let src = dir.file("holes.raw");
    qemu_img(&["create", "-q", "-f", "raw", &src, "8M"]);
    // Whole MiBs of data, then MiBs that are half hole, half data.
    qemu_io(
        "raw",
        &src,
        &[
            "write -P 0x31 0 1M",
            "write -P 0x32 1536k 512k",
            "write -P 0x33 2M 1M",
            "write -P 0x34 3M 512k",
            "write -P 0x35 5M 1M",
            "write -P 0x36 6M 64k",
        ],
    );
    let out = dir.file("out.qcow2");
    for args in [&["-c"][..], &[], &["-c", "-o", "compression_type=zstd"]] {
        let _ = std::fs::remove_file(&out);
        let mut argv = vec!["convert", "-m", "1", "-O", "qcow2"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&[&src, &out]);
        ch(&argv);
        qemu_img(&["compare", "-q", "-f", "raw", "-F", "qcow2", &src, &out]);
    }
}

/// convert's workers ask the kernel to read a raw source ahead of them
/// (POSIX_FADV_WILLNEED), since each reads through its own handle; not
/// through O_DIRECT (`-T none`) and not for a qcow2 source, whose host
/// offsets are not its disk offsets.
#[test]
fn convert_reads_a_raw_source_ahead_only_through_the_page_cache() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 20);
    let src_qcow2 = dir.file("src.qcow2");
    qemu_img(&["convert", "-O", "qcow2", &src, &src_qcow2]);
    let out = dir.file("out.qcow2");
    let count = |source: &str, source_mode: &str| {
        let _ = std::fs::remove_file(&out);
        let n = syscalls(
            "fadvise64",
            &[
                "convert",
                "-c",
                "-O",
                "qcow2",
                "-T",
                source_mode,
                source,
                &out,
            ],
        );
        qemu_img(&["compare", "-q", "-F", "qcow2", source, &out]);
        n
    };
    assert!(count(&src, "writeback") > 0);
    assert_eq!(count(&src, "none"), 0);
    assert_eq!(count(&src_qcow2, "writeback"), 0);
}

/// The read-ahead advice covers a raw source's data only: advice over
/// its holes made the kernel fill the page cache with zero pages that
/// nothing reads (and cost twice qemu-img's whole system time).
#[test]
fn convert_reads_ahead_only_the_data_of_a_sparse_raw_source() {
    let dir = TempDir::new("cache");
    let src = dir.file("sparse.raw");
    qemu_img(&["create", "-q", "-f", "raw", &src, "64M"]);
    let writes: Vec<String> = (0..8)
        .map(|i| format!("write -P 0x5a {}M 512k", i * 8 + 3))
        .collect();
    qemu_io(
        "raw",
        &src,
        &writes.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // Out of the page cache (GNU dd: POSIX_FADV_DONTNEED on the file).
    let dropped = testkit::output_within(
        Command::new("dd").args([&format!("if={src}"), "iflag=nocache", "count=0"]),
        testkit::COMMAND_LIMIT,
    );
    assert!(dropped.status.success(), "dd: {}", stderr(&dropped));
    assert!(resident_bytes(&src) < 1 << 20, "the source is still cached");
    let out = dir.file("out.qcow2");
    ch(&["convert", "-O", "qcow2", &src, &out]);
    qemu_img(&["compare", "-q", "-f", "raw", "-F", "qcow2", &src, &out]);
    // 4 MiB of data, and what the kernel's own readahead adds around it.
    let cached = resident_bytes(&src);
    assert!(
        cached < 16 << 20,
        "{cached} bytes of a 64 MiB file with 4 MiB of data"
    );
}

/// Without -c a chunk boundary moves past a short data extent that would
/// straddle it, so the extent is written in one request, not two: on an
/// O_DIRECT target each is a device write (qemu-img, which walks
/// extents, writes each once).
#[test]
fn extents_that_straddle_a_chunk_boundary_are_written_whole() {
    let dir = TempDir::new("cache");
    let src = dir.file("src.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &src, "8M"]);
    // Three extents; the first two straddle 2 MiB and 4 MiB.
    qemu_io(
        "qcow2",
        &src,
        &[
            "write -P 0x5a 1856k 256k",
            "write -P 0x5b 4032k 576k",
            "write -P 0x5c 5M 64k",
        ],
    );
    let out = dir.file("out.raw");
    for m in ["1", "8"] {
        let _ = std::fs::remove_file(&out);
        let writes = syscalls(
            "pwritev",
            &["convert", "-m", m, "-t", "none", "-O", "raw", &src, &out],
        );
        qemu_img(&["compare", "-q", "-F", "raw", &src, &out]);
        assert_eq!(writes, 3, "-m {m}: one write per extent");
    }
}

/// A buffered convert that flushes starts the output's writeback every
/// 16 chunks (sync_file_range), so its flushes find the data on its way;
/// O_DIRECT and unsafe outputs have nothing to start.
#[test]
fn convert_starts_writeback_early_only_when_it_will_flush() {
    let dir = TempDir::new("cache");
    // 20 MiB: 20 chunks of 16 clusters with -c.
    let src = mixed_source(&dir, 20);
    let out = dir.file("out.qcow2");
    let count = |mode: &str| {
        let _ = std::fs::remove_file(&out);
        let n = syscalls(
            "sync_file_range",
            &["convert", "-c", "-O", "qcow2", "-t", mode, &src, &out],
        );
        qemu_img(&["check", "-q", &out]);
        qemu_img(&["compare", "-q", "-f", "raw", "-F", "qcow2", &src, &out]);
        n
    };
    assert_eq!(count("writeback"), 1);
    assert_eq!(count("writethrough"), 1);
    assert_eq!(count("unsafe"), 0);
    assert_eq!(count("none"), 0);
}

#[test]
fn bench_flushes_as_its_cache_mode_says() {
    let dir = TempDir::new("cache");
    let img = dir.file("b.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &img, "16M"]);
    let bench = |mode| {
        fdatasyncs(&[
            "bench",
            "-w",
            "-c",
            "100",
            "-d",
            "4",
            "-i",
            "threads",
            "--flush-interval=50",
            "-t",
            mode,
            &img,
        ])
    };
    // Every write is followed by a flush in writethrough and directsync.
    assert!(bench("writethrough") >= 100);
    assert!(bench("directsync") >= 100);
    // writeback: the two interval flushes and the close.
    let wb = bench("writeback");
    assert!((2..=4).contains(&wb), "{wb}");
    assert_eq!(bench("unsafe"), 0);
}

#[test]
fn convert_flushes_as_its_cache_mode_says() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 4);
    let out = dir.file("out.qcow2");
    let count = |mode: &str| {
        let _ = std::fs::remove_file(&out);
        fdatasyncs(&["convert", "-m", "1", "-O", "qcow2", "-t", mode, &src, &out])
    };
    let (unsafe_, writeback, writethrough) =
        (count("unsafe"), count("writeback"), count("writethrough"));
    // Every write of a data run is made durable on its own (12 data
    // parts of 256 KiB here, so at least 12 writes); unsafe syncs
    // nothing, not even the qcow2 format's ordering barriers (each
    // one would write back every dirty page of the output so far).
    assert!(writethrough >= 12, "{writethrough}");
    assert!(writethrough > writeback, "{writethrough} vs {writeback}");
    assert!(writeback > 0, "{writeback}");
    assert_eq!(unsafe_, 0, "-t unsafe");
}

/// qemu-img's progress bytes: `    (0.00/100%)\r` ... `(100.00/100%)\r\n`.
fn assert_progress(out: &str, what: &str) {
    assert!(out.starts_with("    (0.00/100%)\r"), "{what}: {out:?}");
    assert!(out.ends_with("    (100.00/100%)\r\n"), "{what}: {out:?}");
}

#[test]
fn progress_is_printed_like_qemu_img() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 4);
    let out = dir.file("out.qcow2");
    assert_progress(
        &ch(&["convert", "-p", "-O", "qcow2", &src, &out]),
        "convert",
    );
    let theirs = qemu_img(&["convert", "-p", "-O", "qcow2", &src, &out]);
    assert_progress(&theirs, "qemu-img convert");
    let top = dir.file("top.qcow2");
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", &out, "-F", "qcow2", &top,
    ]);
    qemu_img(&["rebase", "-q", "-u", "-b", &out, "-F", "qcow2", &top]);
    let rebased = ch(&[
        "rebase",
        "-p",
        "-t",
        "directsync",
        "-T",
        "none",
        "-b",
        "",
        &top,
    ]);
    assert_progress(&rebased, "rebase");
    qemu_img(&["compare", "-f", "raw", &src, &top]);
    let top2 = dir.file("top2.qcow2");
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-b", &top, "-F", "qcow2", &top2,
    ]);
    let committed = ch(&["commit", "-p", "-t", "none", &top2]);
    assert!(committed.ends_with("Image committed.\n"), "{committed:?}");
    assert_progress(committed.trim_end_matches("Image committed.\n"), "commit");
}

#[test]
fn sigusr1_prints_the_progress_once() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 48);
    let out = dir.file("out.qcow2");
    let child = Command::new(ch_img())
        .args([
            "convert",
            "-c",
            "-m",
            "1",
            "-t",
            "writethrough",
            "-O",
            "qcow2",
            &src,
            &out,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Long enough for the handler to be installed (it is, before the copy).
    std::thread::sleep(std::time::Duration::from_millis(700));
    let sent = testkit::signal(child.id(), "USR1");
    assert!(
        sent.is_ok(),
        "the convert ended before SIGUSR1 was sent: {sent:?}"
    );
    let o = testkit::wait_within(
        child,
        "ch-img convert after SIGUSR1",
        testkit::COMMAND_LIMIT,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text:?}");
    assert!(
        lines[0].starts_with("    (") && lines[0].ends_with("/100%)"),
        "{text:?}"
    );
}

#[test]
fn help_prints_each_verbs_synopsis() {
    let list = ch(&["--help"]);
    assert!(
        list.contains("convert") && list.contains("rebase"),
        "{list}"
    );
    for verb in ["convert", "commit", "rebase", "check", "bench", "compare"] {
        let a = ch(&["help", verb]);
        let b = ch(&[verb, "--help"]);
        assert_eq!(a, b);
        assert!(a.starts_with(&format!("usage: ch-img {verb}")), "{a}");
        assert!(a.contains("-t") || a.contains("-T"), "{verb}: {a}");
    }
    let o = ch_status(&["help", "frobnicate"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn enospc_names_the_output_and_leaves_it() {
    let dir = TempDir::new("cache");
    let src = mixed_source(&dir, 24);
    let fs = testkit::mount::Mount::tmpfs("4M");
    let check = fs.as_ref().map(|_| ()).map_err(Clone::clone);
    if !testkit::available("a tmpfs mount", check) {
        return;
    }
    let fs = fs.unwrap();
    for (mode, compress) in [("unsafe", false), ("none", true), ("writeback", true)] {
        let out = fs.file("out.qcow2");
        let mut args = vec!["convert", "-O", "qcow2", "-t", mode];
        if compress {
            args.push("-c");
        }
        args.extend([src.as_str(), out.as_str()]);
        let o = ch_status(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains(&out) && e.contains("No space left on device"),
            "{args:?}: {e}"
        );
        assert!(
            std::path::Path::new(&out).exists(),
            "the partial output is left, as qemu-img leaves it"
        );
        // What was written is consistent: no corruption (leaks may remain).
        let check = qemu_img_status(&["check", &out]);
        assert_ne!(check.status.code(), Some(2), "{}", stderr(&check));
        std::fs::remove_file(&out).unwrap();
    }
}
