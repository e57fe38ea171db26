//! Interop (read side): images made and written by qemu-img/qemu-io are read
//! by ch-img exactly as qemu-img reads them.
//!
//! For each image of the matrix (versions, cluster sizes, refcount widths,
//! compression, backing chains, extended L2, external data file,
//! preallocation, a dirty lazy-refcounts image) `ch-img convert -O raw`
//! must equal `qemu-img convert -O raw` byte for byte; `ch-img info
//! --output=json` must agree on the key fields, and on some images `ch-img
//! map --output=json` must equal qemu-img's.

use integration_tests::{
    assert_same_bytes, ch, ch_status, json, qemu_create_overlay, qemu_img, qemu_img_status,
    qemu_io, run, TempDir,
};

const MIB: u64 = 1 << 20;

/// Virtual size used for a cluster size: room for the pattern below.
fn size_for(cs: u64) -> u64 {
    (8 * cs).max(8 * MIB)
}

/// qemu-io commands that cross cluster boundaries, zero and discard.
fn pattern(cs: u64, seed: u8) -> Vec<String> {
    let size = size_for(cs);
    vec![
        format!("write -P {:#x} 0 {}", seed, cs + 512),
        format!(
            "write -P {:#x} {} 2048",
            seed.wrapping_add(1),
            3 * cs - 1024
        ),
        format!("write -P {:#x} {} {}", seed.wrapping_add(2), 4 * cs, 2 * cs),
        format!("write -z {} {}", 5 * cs, cs),
        format!("discard {} {}", 4 * cs, cs),
        format!("write -P {:#x} {} 4096", seed.wrapping_add(3), size - 4096),
    ]
}

fn write_pattern(fmt: &str, image: &str, cs: u64, seed: u8) {
    let cmds = pattern(cs, seed);
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io(fmt, image, &refs);
}

/// ch-img and qemu-img convert the image to the same raw bytes.
fn assert_converts_like_qemu(dir: &TempDir, image: &str) {
    let q = dir.file("qemu.raw");
    let c = dir.file("ch.raw");
    qemu_img(&["convert", "-O", "raw", image, &q]);
    ch(&["convert", "-O", "raw", image, &c]);
    assert_same_bytes(&q, &c);
}

/// `info --output=json` agrees on the fields both tools compute the same way.
fn assert_info_like_qemu(image: &str) {
    let q = json(&qemu_img(&["info", "--output=json", "-U", image]));
    let c = json(&ch(&["info", "--output=json", image]));
    for key in [
        "virtual-size",
        "format",
        "cluster-size",
        "backing-filename",
        "backing-filename-format",
        "dirty-flag",
    ] {
        assert_eq!(q.get(key), c.get(key), "info key {key} of {image}");
    }
    for key in [
        "compat",
        "lazy-refcounts",
        "refcount-bits",
        "corrupt",
        "extended-l2",
        "compression-type",
    ] {
        let q = &q["format-specific"]["data"][key];
        let c = &c["format-specific"]["data"][key];
        assert_eq!(q, c, "info format-specific key {key} of {image}");
    }
}

/// `check --output=json` and the exit status equal qemu-img's.
fn assert_check_like_qemu(image: &str) {
    let q = qemu_img_status(&["check", "--output=json", image]);
    let c = ch_status(&["check", "--output=json", image]);
    assert_eq!(
        q.status.code(),
        c.status.code(),
        "check exit status of {image}"
    );
    let qj = json(&String::from_utf8_lossy(&q.stdout));
    let cj = json(&String::from_utf8_lossy(&c.stdout));
    assert_eq!(qj, cj, "check of {image}");
}

fn assert_map_like_qemu(image: &str) {
    let q = json(&qemu_img(&["map", "--output=json", image]));
    let c = json(&ch(&["map", "--output=json", image]));
    assert_eq!(q, c, "map of {image}");
}

fn plain(version: &str, cs: u64, refcount_bits: u32) -> (TempDir, String) {
    let dir = TempDir::new("interop");
    let img = dir.file("img.qcow2");
    let opts = format!("compat={version},cluster_size={cs},refcount_bits={refcount_bits}");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &opts,
        &img,
        &size_for(cs).to_string(),
    ]);
    write_pattern("qcow2", &img, cs, 0x11);
    (dir, img)
}

#[test]
fn v2_64k() {
    let (dir, img) = plain("0.10", 65536, 16);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn v3_64k() {
    let (dir, img) = plain("1.1", 65536, 16);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn v3_512b_clusters() {
    let (dir, img) = plain("1.1", 512, 16);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn v3_4k_clusters() {
    let (dir, img) = plain("1.1", 4096, 16);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn v3_2m_clusters() {
    let (dir, img) = plain("1.1", 2 * MIB, 16);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn v3_refcount_bits_1() {
    let (dir, img) = plain("1.1", 65536, 1);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn v3_refcount_bits_64() {
    let (dir, img) = plain("1.1", 65536, 64);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

fn compressed(extra: &[&str]) -> (TempDir, String) {
    let (dir, src) = plain("1.1", 65536, 16);
    let img = dir.file("compressed.qcow2");
    let mut args = vec!["convert", "-c", "-O", "qcow2"];
    args.extend_from_slice(extra);
    args.push(&src);
    args.push(&img);
    qemu_img(&args);
    (dir, img)
}

#[test]
fn compressed_zlib() {
    let (dir, img) = compressed(&[]);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn compressed_zstd() {
    let (dir, img) = compressed(&["-o", "compression_type=zstd"]);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn backing_chain_three_deep_over_raw() {
    let dir = TempDir::new("interop");
    let cs = 65536;
    let size = size_for(cs).to_string();
    let base = dir.file("base.raw");
    qemu_img(&["create", "-q", "-f", "raw", &base, &size]);
    qemu_io("raw", &base, &["write -P 0xa1 0 8M"]);
    let mut below = (base.clone(), "raw");
    for (i, seed) in [(1, 0x21u8), (2, 0x41), (3, 0x61)] {
        let img = dir.file(&format!("layer{i}.qcow2"));
        // Relative backing names: resolved against the overlay's folder.
        let name = std::path::Path::new(&below.0)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        qemu_create_overlay(&img, &name, below.1);
        let off = u64::from(seed) * 4096;
        qemu_io(
            "qcow2",
            &img,
            &[
                &format!("write -P {seed:#x} {off} {}", cs * i + 512),
                &format!("write -z {} 4096", off + 2 * cs * i),
            ],
        );
        below = (img, "qcow2");
    }
    let top = below.0;
    assert_converts_like_qemu(&dir, &top);
    assert_info_like_qemu(&top);
    assert_check_like_qemu(&top);
}

#[test]
fn extended_l2_over_backing() {
    let dir = TempDir::new("interop");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "8M"]);
    qemu_io("qcow2", &base, &["write -P 0x77 0 2M"]);
    let img = dir.file("ext.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "extended_l2=on,cluster_size=64k",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        &img,
    ]);
    // 2 KiB subclusters: partial writes, zeroes and a discard inside clusters.
    qemu_io(
        "qcow2",
        &img,
        &[
            "write -P 0x12 4096 2048",
            "write -P 0x13 70000 5000",
            "write -z 131072 4096",
            "write -P 0x14 1M 64k",
            "discard 1M 8192",
        ],
    );
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

#[test]
fn external_data_file() {
    let dir = TempDir::new("interop");
    let img = dir.file("ext-data.qcow2");
    let data = dir.file("ext-data.raw");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={data}"),
        &img,
        "8M",
    ]);
    write_pattern("qcow2", &img, 65536, 0x31);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

fn preallocated(mode: &str) {
    let (dir, img) = preallocated_image(mode);
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

fn preallocated_image(mode: &str) -> (TempDir, String) {
    let dir = TempDir::new("interop");
    let img = dir.file("prealloc.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("preallocation={mode}"),
        &img,
        "8M",
    ]);
    write_pattern("qcow2", &img, 65536, 0x51);
    (dir, img)
}

#[test]
fn preallocation_metadata() {
    preallocated("metadata");
}

#[test]
fn preallocation_falloc() {
    preallocated("falloc");
}

#[test]
fn preallocation_full() {
    preallocated("full");
}

#[test]
fn lazy_refcounts_left_dirty() {
    let dir = TempDir::new("interop");
    let img = dir.file("dirty.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "lazy_refcounts=on",
        &img,
        "8M",
    ]);
    // qemu-io kills itself before closing: the dirty bit stays set.
    let out = run(
        "qemu-io",
        &[
            "-f",
            "qcow2",
            "-c",
            "write -P 0x66 0 192k",
            "-c",
            "write -P 0x67 1M 4k",
            "-c",
            "sigraise 9",
            &img,
        ],
    );
    assert!(!out.status.success(), "qemu-io should have died of SIGKILL");
    let info = json(&qemu_img(&["info", "--output=json", "-U", &img]));
    assert_eq!(
        info["dirty-flag"], true,
        "the image must be left dirty for this test"
    );
    assert_converts_like_qemu(&dir, &img);
    assert_info_like_qemu(&img);
    assert_check_like_qemu(&img);
}

// `map --output=json` must equal qemu-img's: same extents, flags, depths
// and host offsets after qemu-img's merging.

#[test]
fn map_v2_64k() {
    assert_map_like_qemu(&plain("0.10", 65536, 16).1);
}

#[test]
fn map_v3_64k_with_zero_clusters() {
    assert_map_like_qemu(&plain("1.1", 65536, 16).1);
}

#[test]
fn map_v3_512b_clusters() {
    assert_map_like_qemu(&plain("1.1", 512, 16).1);
}

#[test]
fn map_v3_2m_clusters() {
    assert_map_like_qemu(&plain("1.1", 2 * MIB, 16).1);
}

#[test]
fn map_raw_with_holes() {
    let dir = TempDir::new("interop");
    let img = dir.file("sparse.raw");
    qemu_img(&["create", "-q", "-f", "raw", &img, "4M"]);
    qemu_io(
        "raw",
        &img,
        &["write -P 0x31 512k 4k", "write -P 0x32 3M 128k"],
    );
    assert_map_like_qemu(&img);
}

#[test]
fn map_compressed() {
    assert_map_like_qemu(&compressed(&[]).1);
    assert_map_like_qemu(&compressed(&["-o", "compression_type=zstd"]).1);
}

#[test]
fn map_backing_chain_and_extended_l2() {
    let dir = TempDir::new("interop");
    let base = dir.file("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &base, "8M"]);
    qemu_io("qcow2", &base, &["write -P 0x77 0 2M"]);
    for (name, opts) in [
        ("mid.qcow2", "cluster_size=64k"),
        ("ext.qcow2", "extended_l2=on,cluster_size=64k"),
    ] {
        let img = dir.file(name);
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            opts,
            "-b",
            "base.qcow2",
            "-F",
            "qcow2",
            &img,
        ]);
        qemu_io(
            "qcow2",
            &img,
            &[
                "write -P 0x12 4096 2048",
                "write -P 0x13 70000 5000",
                "write -P 0x14 1M 64k",
            ],
        );
        assert_map_like_qemu(&img);
    }
}

#[test]
fn map_preallocation_falloc() {
    assert_map_like_qemu(&preallocated_image("falloc").1);
}

/// qemu-img detects metadata preallocation (far more clusters referenced
/// than the file really stores) and then reports the file's holes under
/// mapped clusters as zero; so must we, in both output formats.
#[test]
fn map_preallocation_metadata() {
    let (_dir, img) = preallocated_image("metadata");
    assert_map_like_qemu(&img);
    assert_eq!(qemu_img(&["map", &img]), ch(&["map", &img]), "map of {img}");
}

#[test]
fn internal_snapshots_are_counted_by_check() {
    let (dir, img) = plain("1.1", 65536, 16);
    qemu_img(&["snapshot", "-c", "first", &img]);
    // Rewrite shared clusters after the snapshot: COW leaves refcounts of
    // 2 on the old ones and allocates new ones.
    write_pattern("qcow2", &img, 65536, 0x91);
    qemu_img(&["snapshot", "-c", "second", &img]);
    qemu_io("qcow2", &img, &["write -P 0x99 64k 128k"]);
    assert_check_like_qemu(&img);
    assert_converts_like_qemu(&dir, &img);
}

#[test]
fn persistent_bitmaps_are_counted_by_check() {
    let (dir, img) = plain("1.1", 65536, 16);
    qemu_img(&["bitmap", "--add", &img, "b0"]);
    qemu_img(&["bitmap", "--add", "-g", "128k", &img, "b1"]);
    // qemu-io records the write in both bitmaps (their data clusters).
    qemu_io("qcow2", &img, &["write -P 0x42 2M 1M"]);
    assert_check_like_qemu(&img);
    assert_converts_like_qemu(&dir, &img);
    // A repair must not take the bitmaps' clusters for leaks.
    let out = ch_status(&["check", "-r", "leaks", &img]);
    assert_eq!(out.status.code(), Some(0));
    assert_check_like_qemu(&img);
}
