//! A new overlay on an image that is open and being written
//! (`block::overlay::NewOverlay`, `ExclusiveImage::open_overlay`): made
//! without opening the running image again, opened with the running
//! image's open format as its backing image, it reads the running
//! image's data and takes new writes itself; refused before anything is
//! written where the path exists, is the running image or one of its
//! backing files; an overlay whose header names another backing file is
//! refused at open; an overlay dropped before `keep` is removed.

mod support;

use block::create::{create_image, CreateOptions};
use block::options::ImageType;
use block::overlay::{NewOverlay, OverlayError};
use block::{DiskOptions, ExclusiveImage};
use support::*;

const MIB: u64 = 1 << 20;

fn qcow2(dir: &TempDir, name: &str, backing: Option<&str>) -> std::path::PathBuf {
    let path = dir.join(name);
    create_image(&CreateOptions {
        path: path.clone(),
        format: ImageType::Format("qcow2"),
        size: 4 * MIB,
        backing_file: backing.map(str::to_string),
        backing_fmt: backing.map(|_| ImageType::Format("qcow2")),
        ..Default::default()
    })
    .unwrap();
    path
}

fn open_owned(path: &std::path::Path) -> ExclusiveImage {
    let mut o = DiskOptions::new(path);
    o.image_type = ImageType::Format("qcow2");
    ExclusiveImage::open(&o).unwrap()
}

#[test]
fn an_overlay_reads_the_running_image_and_takes_the_new_writes() {
    let d = temp_dir("overlay-open");
    let base = qcow2(&d, "base.qcow2", None);
    let running = open_owned(&base);
    running.disk().write_at(0, &[1; 4096]).unwrap();
    let ov = d.join("ov.qcow2");
    let overlay = NewOverlay::create(&ov, running.disk()).unwrap();
    let top = overlay.open(running.disk()).unwrap();
    overlay.keep();
    let mut buf = vec![0; 4096];
    top.disk().read_at(0, &mut buf).unwrap();
    assert_eq!(buf, vec![1; 4096], "the running image's data shows through");
    top.disk().write_at(65536, &[2; 4096]).unwrap();
    top.disk().write_at(0, &[3; 512]).unwrap();
    top.disk().read_at(0, &mut buf).unwrap();
    assert_eq!(&buf[..512], &[3; 512][..]);
    assert_eq!(
        &buf[512..],
        &[1; 3584][..],
        "copy-on-write from the backing"
    );
    top.close().unwrap();
    running.close().unwrap();
    qemu_check(&ov);
    qemu_check(&base);
    let base_again = open_owned(&base);
    base_again.disk().read_at(0, &mut buf).unwrap();
    assert_eq!(buf, vec![1; 4096], "the base kept what it had");
    base_again.disk().read_at(65536, &mut buf).unwrap();
    assert_eq!(buf, vec![0; 4096], "the new writes are not in the base");
}

#[test]
fn refusals_write_nothing_and_a_dropped_overlay_is_removed() {
    let d = temp_dir("overlay-refuse");
    let lower = qcow2(&d, "lower.qcow2", None);
    let upper = qcow2(&d, "upper.qcow2", Some("lower.qcow2"));
    let running = open_owned(&upper);
    let taken = d.join("taken");
    std::fs::write(&taken, b"mine").unwrap();
    let err = |p: &std::path::Path| match NewOverlay::create(p, running.disk()) {
        Err(e) => e,
        Ok(_) => panic!("{} was taken as an overlay", p.display()),
    };
    assert!(matches!(err(&upper), OverlayError::IsRunningImage(_)));
    assert!(matches!(err(&lower), OverlayError::InChain(_)));
    // Another name of a backing file is the same file.
    let link = d.join("link.qcow2");
    std::fs::hard_link(&lower, &link).unwrap();
    assert!(matches!(err(&link), OverlayError::InChain(_)));
    assert!(matches!(err(&taken), OverlayError::Exists(_)));
    assert_eq!(std::fs::read(&taken).unwrap(), b"mine");
    // Made, then dropped before keep: gone again.
    let ov = d.join("dropped.qcow2");
    drop(NewOverlay::create(&ov, running.disk()).unwrap());
    assert!(!ov.exists());
    // An overlay that names another backing file is refused at open.
    let other = qcow2(&d, "other.qcow2", Some("lower.qcow2"));
    let mut o = DiskOptions::new(&other);
    o.image_type = ImageType::Format("qcow2");
    match ExclusiveImage::open_overlay(&o, running.disk()) {
        Ok(_) => panic!("an overlay of lower.qcow2 opened over upper.qcow2"),
        Err(e) => assert!(e.to_string().contains("not the open image"), "{e}"),
    }
    running.close().unwrap();
}
