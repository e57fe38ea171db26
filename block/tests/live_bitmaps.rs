//! Persistent dirty bitmaps of a running qcow2 disk (`block::live`), held
//! against qemu-img: an owner that opens the image with
//! `records_bitmaps` and attaches its bitmaps finds QEMU's bitmaps with
//! the bits QEMU recorded, marks them in use on disk (qemu-img sees
//! `in-use`), records writes in the enabled ones, and on close stores
//! them back as qemu-img reads them (not in use, new ones added, removed
//! ones gone, `qemu-img check` clean). An owner that never closes (a
//! crash) leaves them in use; opened again they are inconsistent, refused
//! for use, kept in the image until removed, and QEMU refuses them too.

mod support;

use std::path::Path;

use block::live::LiveError;
use block::{DiskOptions, ExclusiveImage};
use support::*;

fn open_recording(p: &Path) -> ExclusiveImage {
    let mut o = DiskOptions::new(p);
    o.records_bitmaps = true;
    // The crash test leaks an open; a second open in this process must
    // not meet its lock.
    o.lock = false;
    let image = ExclusiveImage::open(&o).unwrap();
    image.attach_persistent_bitmaps().unwrap();
    image
}

/// `(name, flags)` of each bitmap `qemu-img info` lists.
fn qemu_bitmaps(p: &Path) -> Vec<(String, Vec<String>)> {
    let out = qemu_img(&["info", "-U", "--output=json", s(p)]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let list = &v["format-specific"]["data"]["bitmaps"];
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|b| {
                    let flags = b["flags"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|f| f.as_str().unwrap().to_string())
                        .collect();
                    (b["name"].as_str().unwrap().to_string(), flags)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The dirty extents of bitmap `name` as a fresh read-only open reads
/// them (the reader `ch-img bitmap` uses).
fn stored_extents(p: &Path, name: &str) -> Vec<(u64, u64)> {
    let mut o = DiskOptions::new(p);
    o.readonly = true;
    o.lock = false;
    let image = ExclusiveImage::open(&o).unwrap();
    let bits = image.tools().read_bitmap(name).unwrap();
    let b = block::live::DirtyBitmap::from_bits(&bits).unwrap();
    b.extents().collect()
}

fn sample(dir: &TempDir) -> std::path::PathBuf {
    let img = dir.join("img.qcow2");
    qemu_create("qcow2", s(&img), "64M", "");
    run("qemu-img", &["bitmap", "--add", s(&img), "b0"]);
    qemu_io("qcow2", &img, &["write 0 64k"]);
    run(
        "qemu-img",
        &["bitmap", "--add", "-g", "512", "--disable", s(&img), "off"],
    );
    img
}

#[test]
fn bitmaps_are_loaded_marked_in_use_recorded_and_stored_back() {
    let dir = temp_dir("live-bitmaps");
    let img = sample(&dir);
    let image = open_recording(&img);
    {
        let reg = image.disk().live().bitmaps();
        let infos = reg.infos();
        assert_eq!(infos.len(), 2);
        assert_eq!(
            (infos[0].name.as_str(), infos[0].recording, infos[0].count),
            ("b0", true, 65536)
        );
        assert_eq!(
            (
                infos[1].name.as_str(),
                infos[1].recording,
                infos[1].granularity
            ),
            ("off", false, 512)
        );
    }
    let marked = qemu_bitmaps(&img);
    assert!(
        marked
            .iter()
            .all(|(_, f)| f.contains(&"in-use".to_string())),
        "{marked:?}"
    );
    let disk = image.disk();
    disk.write_at(1 << 20, &[7; 4096]).unwrap();
    {
        let mut reg = disk.live().bitmaps();
        reg.add("new", 65536, true, false).unwrap();
        reg.remove("off").unwrap();
    }
    disk.write_zeroes(2 << 20, 4096, false).unwrap();
    image.close().unwrap();

    let after = qemu_bitmaps(&img);
    assert_eq!(
        after,
        vec![
            ("b0".to_string(), vec!["auto".to_string()]),
            ("new".to_string(), vec!["auto".to_string()]),
        ]
    );
    qemu_check(&img);
    assert_eq!(
        stored_extents(&img, "b0"),
        vec![(0, 65536), (1 << 20, 65536), (2 << 20, 65536)]
    );
    assert_eq!(stored_extents(&img, "new"), vec![(2 << 20, 65536)]);
    // QEMU takes them up again: it records into b0 and clears it.
    run("qemu-img", &["bitmap", "--clear", s(&img), "b0"]);
}

#[test]
fn a_crash_leaves_bitmaps_in_use_and_they_stay_refused_until_removed() {
    let dir = temp_dir("live-bitmaps-crash");
    let img = sample(&dir);
    let image = open_recording(&img);
    image.disk().write_at(0, &[1; 512]).unwrap();
    // The owner dies without closing: nothing is written back.
    std::mem::forget(image);
    let left = qemu_bitmaps(&img);
    assert_eq!(left.len(), 2);
    assert!(
        left.iter().all(|(_, f)| f.contains(&"in-use".to_string())),
        "{left:?}"
    );
    let check = qemu_img_output(&["check", "-U", s(&img)]);
    assert!(check.status.success(), "{check:?}");
    let out = dir.join("copy.qcow2");
    let (ok, text) = run_status(
        "qemu-img",
        &[
            "convert",
            "-U",
            "--bitmaps",
            "-O",
            "qcow2",
            s(&img),
            s(&out),
        ],
    );
    assert!(!ok && text.contains("inconsistent"), "{text}");

    let image = open_recording(&img);
    {
        let mut reg = image.disk().live().bitmaps();
        assert!(reg.list().iter().all(|b| b.inconsistent));
        assert!(reg.recording().is_empty());
        assert_eq!(
            reg.merge("b0", &[]),
            Err(LiveError::Inconsistent("b0".into()))
        );
        assert_eq!(
            reg.enable("off"),
            Err(LiveError::Inconsistent("off".into()))
        );
        reg.remove("off").unwrap();
    }
    image.close().unwrap();
    assert_eq!(
        qemu_bitmaps(&img),
        vec![(
            "b0".to_string(),
            vec!["in-use".to_string(), "auto".to_string()]
        )]
    );
    qemu_check(&img);
}

#[test]
fn an_image_without_bitmaps_is_not_rewritten_and_raw_ones_stay_in_memory() {
    let dir = temp_dir("live-bitmaps-none");
    let img = dir.join("plain.qcow2");
    qemu_create("qcow2", s(&img), "16M", "");
    let header = std::fs::read(&img).unwrap()[..512].to_vec();
    let image = open_recording(&img);
    image.close().unwrap();
    assert_eq!(&std::fs::read(&img).unwrap()[..512], &header[..]);

    let raw = dir.join("d.raw");
    std::fs::File::create(&raw)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let image = open_recording(&raw);
    let e = image
        .disk()
        .live()
        .bitmaps()
        .add("p", 65536, true, false)
        .unwrap_err();
    assert!(e.to_string().contains("in memory only"), "{e}");
    image
        .disk()
        .live()
        .bitmaps()
        .add("m", 65536, false, false)
        .unwrap();
    image.close().unwrap();
}

#[test]
fn an_image_dropped_without_close_still_stores_its_bitmaps() {
    let dir = temp_dir("live-bitmaps-drop");
    let img = sample(&dir);
    let image = open_recording(&img);
    image.disk().write_at(3 << 20, &[2; 4096]).unwrap();
    drop(image);
    assert_eq!(
        qemu_bitmaps(&img),
        vec![
            ("b0".to_string(), vec!["auto".to_string()]),
            ("off".to_string(), vec![]),
        ]
    );
    assert_eq!(
        stored_extents(&img, "b0"),
        vec![(0, 65536), (3 << 20, 65536)]
    );
    qemu_check(&img);
}

#[test]
fn a_grown_disk_rewrites_its_bitmaps_so_a_crash_leaves_an_image_that_opens() {
    let dir = temp_dir("live-bitmaps-resize");
    let img = sample(&dir);
    let image = open_recording(&img);
    image.resizer().resize(8 << 30).unwrap();
    image.disk().live().resize(image.disk().size()).unwrap();
    image.disk().write_at(100 << 20, &[3; 4096]).unwrap();
    std::mem::forget(image);
    // The tables fit 8 GiB (32 clusters for the 512-byte bitmap, one
    // before): qemu-img opens the image, the bitmaps in
    // use, and so does the next owner.
    let left = qemu_bitmaps(&img);
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|(_, f)| f.contains(&"in-use".to_string())));
    qemu_check(&img);
    let image = open_recording(&img);
    assert!(image
        .disk()
        .live()
        .bitmaps()
        .list()
        .iter()
        .all(|b| b.inconsistent));
    image.close().unwrap();

    // Grown and closed cleanly: the bits at the new size.
    let dir = temp_dir("live-bitmaps-resize-clean");
    let img = sample(&dir);
    let image = open_recording(&img);
    image.resizer().resize(8 << 30).unwrap();
    image.disk().live().resize(image.disk().size()).unwrap();
    image.disk().write_at(100 << 20, &[3; 4096]).unwrap();
    image.close().unwrap();
    qemu_check(&img);
    assert_eq!(
        stored_extents(&img, "b0"),
        vec![(0, 65536), (100 << 20, 65536)]
    );
    assert!(qemu_img(&["info", s(&img)]).contains("8 GiB"));
}
