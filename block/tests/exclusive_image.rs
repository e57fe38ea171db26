//! The owner's open (`ExclusiveImage`): a tool that does I/O through its
//! disk and calls tool capabilities between requests, the `Resizer` lent
//! to queue threads (a grown area over a longer backing file reads as
//! zeroes), and qcow2 refusing a shrink while an allocating write is in
//! flight. That queue handles cannot reach the tools at all is checked by
//! the compiler (the `compile_fail` example in `block/src/exclusive.rs`).

mod support;

use block::create::{create_image, CreateOptions};
use block::formats::WriteOutcome;
use block::options::ImageType;
use block::{DiskOptions, ExclusiveImage};
use support::*;

const MIB: u64 = 1 << 20;

fn qcow2(dir: &TempDir, name: &str, size: u64, backing: Option<&str>) -> std::path::PathBuf {
    let path = dir.join(name);
    create_image(&CreateOptions {
        path: path.clone(),
        format: ImageType::Format("qcow2"),
        size,
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
fn owner_does_io_and_snapshots_between_requests() {
    let d = temp_dir("exclusive-snap");
    let p = qcow2(&d, "a.qcow2", 4 * MIB, None);
    let image = open_owned(&p);
    image.disk().write_at(0, &[1; 4096]).unwrap();
    image.tools().snapshot_create("one", (0, 0)).unwrap();
    image.disk().write_at(0, &[2; 4096]).unwrap();
    let mut buf = vec![0; 4096];
    image.disk().read_at(0, &mut buf).unwrap();
    assert_eq!(buf, vec![2; 4096]);
    assert!(image.tools().snapshot_apply("one").unwrap());
    image.disk().read_at(0, &mut buf).unwrap();
    assert_eq!(buf, vec![1; 4096], "the snapshot's data is back");
    image.close().unwrap();
    qemu_check(&p);
}

#[test]
fn resizer_zeroes_growth_over_a_longer_backing_file() {
    let d = temp_dir("exclusive-grow");
    let base = qcow2(&d, "base.qcow2", 4 * MIB, None);
    {
        let b = open_owned(&base);
        b.disk().write_at(0, &vec![0xbb; 4 * MIB as usize]).unwrap();
        b.close().unwrap();
    }
    let top = qcow2(&d, "top.qcow2", MIB, Some("base.qcow2"));
    let image = open_owned(&top);
    let resizer = image.resizer();
    resizer.resize(3 * MIB).unwrap();
    assert_eq!(image.disk().size(), 3 * MIB);
    let mut buf = vec![0xff; 2 * MIB as usize];
    image.disk().read_at(MIB, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0),
        "the grown area reads as zeroes"
    );
    let mut head = vec![0; 4096];
    image.disk().read_at(0, &mut head).unwrap();
    assert_eq!(head, vec![0xbb; 4096], "the old area still reads through");
    image.close().unwrap();
    qemu_check(&top);
}

#[test]
fn qcow2_refuses_a_shrink_while_an_allocating_write_is_in_flight() {
    let d = temp_dir("exclusive-shrink");
    let p = qcow2(&d, "a.qcow2", 4 * MIB, None);
    let f = open(&p, false);
    let WriteOutcome::Ready(plan) = f.plan_write(3 * MIB, 4096, &waker()).unwrap() else {
        panic!("an unallocated cluster is not blocked");
    };
    let commit = plan.commit.expect("an allocating write has a commit");
    let err = f.resize(MIB).unwrap_err();
    assert!(
        err.to_string().contains("in flight"),
        "shrink refused with a reason: {err}"
    );
    assert_eq!(f.size(), 4 * MIB, "the size did not change");
    f.abort(commit);
    f.resize(MIB).unwrap();
    assert_eq!(f.size(), MIB);
    f.close().unwrap();
    drop(f);
    qemu_check(&p);
}
