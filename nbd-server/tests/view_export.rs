//! A point-in-time view of a disk that keeps changing, served by the
//! server as `ViewSource`: clients nobody here wrote (qemu-img, nbdinfo)
//! read the disk as it was at the instant, its frozen bitmap and its
//! allocation; a client that vanishes in the middle of reads costs the
//! export nothing.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use block::create::{create_image, CreateOptions};
use block::live::{CopyBeforeWrite, PointInTimeView};
use block::{Disk, DiskOptions, ImageType, IoMemory, RequestOp};
use nbd::client::{connect, ClientConfig, NbdUri};
use nbd_server::{ExportConfig, ListenAddr, NbdServer, ViewSource};

const MIB: u64 = 1 << 20;
const SIZE: u64 = 4 * MIB;

fn run(cmd: &mut Command) -> String {
    let out = testkit::output_within(cmd, testkit::COMMAND_LIMIT);
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A raw disk with data in its first 3 MiB and zeroes in the last; an
/// empty qcow2 scratch image.
fn disks(dir: &testkit::TempDir) -> (Disk, Disk) {
    let path = dir.path().join("disk.raw");
    let data: Vec<u8> = (0..3 * MIB).map(|i| (i % 241) as u8 | 1).collect();
    std::fs::write(&path, &data).unwrap();
    // The last MiB a hole.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    let scratch = dir.path().join("scratch.qcow2");
    create_image(&CreateOptions {
        path: scratch.clone(),
        format: ImageType::Format("qcow2"),
        size: SIZE,
        ..Default::default()
    })
    .unwrap();
    (
        Disk::open(&DiskOptions::new(&path)).unwrap(),
        Disk::open(&DiskOptions::new(&scratch)).unwrap(),
    )
}

#[test]
fn the_view_is_read_as_it_was_at_its_instant() {
    if !["qemu-img", "qemu-io", "nbdinfo"]
        .iter()
        .all(|t| testkit::has_command(t))
    {
        return;
    }
    let dir = testkit::TempDir::new("nbd-view-export");
    let (disk, scratch) = disks(&dir);
    let mut q = disk.queue().unwrap();
    // A bitmap that recorded two writes before the instant.
    disk.live()
        .bitmaps()
        .add("inc", 65536, false, false)
        .unwrap();
    q.run(RequestOp::Write, 65536, IoMemory::Owned(vec![7; 4096]))
        .unwrap();
    q.run(
        RequestOp::Write,
        5 * 65536,
        IoMemory::Owned(vec![7; 65536 * 2]),
    )
    .unwrap();
    let mut instant = vec![0; SIZE as usize];
    disk.read_at(0, &mut instant).unwrap();
    // The instant: the bitmap frozen, the filter installed.
    let frozen = Arc::new(disk.live().bitmaps().find("inc").unwrap().bitmap.frozen());
    let cbw = Arc::new(CopyBeforeWrite::new(&disk, &scratch).unwrap());
    disk.live().set_cbw(Some(cbw.clone()));
    let view = Arc::new(PointInTimeView::new(cbw, Some(("inc".into(), frozen))));
    let sock = dir.path().join("view.sock");
    let config = ExportConfig {
        addr: ListenAddr::Unix(sock.clone()),
        name: "vda".into(),
        description: None,
        writable: false,
        max_connections: 0,
    };
    let server = NbdServer::start(&config, Arc::new(ViewSource::new(view))).unwrap();
    let uri = server.uri();
    // The disk changes after the instant: data, zeroes, the zero tail.
    q.run(RequestOp::Write, 0, IoMemory::Owned(vec![0xaa; 200_000]))
        .unwrap();
    q.run(
        RequestOp::WriteZeroes {
            len: MIB,
            may_unmap: true,
        },
        MIB,
        IoMemory::None,
    )
    .unwrap();
    q.run(RequestOp::Write, 3 * MIB, IoMemory::Owned(vec![0xbb; 4096]))
        .unwrap();
    let out = dir.path().join("backup.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &uri])
        .arg(&out));
    assert!(
        std::fs::read(&out).unwrap() == instant,
        "the export is not the disk at the instant"
    );
    // The frozen bitmap: the writes before the instant only.
    let map = run(Command::new("nbdinfo").args(["--map=qemu:dirty-bitmap:inc", &uri]));
    assert_eq!(
        map,
        "         0       65536    0  clean\n     \
         65536       65536    1  dirty\n    \
         131072      196608    0  clean\n    \
         327680      131072    1  dirty\n    \
         458752     3735552    0  clean\n"
    );
    // base:allocation: the zero tail of the instant, though it holds
    // data now.
    let map = run(Command::new("nbdinfo").args(["--map", &uri]));
    assert!(
        map.ends_with(&format!("{:>10}  {:>10}    3  hole,zero\n", 3 * MIB, MIB)),
        "{map}"
    );
    // Writes are refused: the export is read-only (qemu-io will not
    // open it for writing).
    let o = testkit::output_within(
        Command::new("qemu-io").args(["-f", "raw", "-c", "write 0 4096", &uri]),
        testkit::COMMAND_LIMIT,
    );
    let said = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() || said.contains("failed"), "{said}");
    assert!(said.contains("Permission denied"), "{said}");
    server.stop();
    disk.live().set_cbw(None);
}

#[test]
fn a_client_that_vanishes_mid_read_leaves_the_export_serving() {
    if !testkit::has_command("nbdinfo") {
        return;
    }
    let dir = testkit::TempDir::new("nbd-view-vanish");
    let (disk, scratch) = disks(&dir);
    let cbw = Arc::new(CopyBeforeWrite::new(&disk, &scratch).unwrap());
    disk.live().set_cbw(Some(cbw.clone()));
    let view = Arc::new(PointInTimeView::new(cbw, None));
    let sock = dir.path().join("view.sock");
    let config = ExportConfig {
        addr: ListenAddr::Unix(sock.clone()),
        name: "vda".into(),
        description: None,
        writable: false,
        max_connections: 0,
    };
    let server = NbdServer::start(&config, Arc::new(ViewSource::new(view))).unwrap();
    let uri = NbdUri::parse(&server.uri()).unwrap();
    for _ in 0..3 {
        let cfg = ClientConfig {
            export: "vda".into(),
            structured: true,
            block_status: false,
        };
        let (mut s, info) = connect(&uri, &cfg, Duration::from_secs(10)).unwrap();
        assert_eq!(info.size, SIZE);
        // Many 1 MiB reads, then gone without reading a reply.
        let mut req = Vec::new();
        for k in 0..32u64 {
            req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
            req.extend_from_slice(&0u16.to_be_bytes());
            req.extend_from_slice(&0u16.to_be_bytes());
            req.extend_from_slice(&k.to_be_bytes());
            req.extend_from_slice(&((k % 4) * MIB).to_be_bytes());
            req.extend_from_slice(&(MIB as u32).to_be_bytes());
        }
        s.write_all(&req).unwrap();
        drop(s);
    }
    // The export still serves, and a write to the disk still copies.
    let mut q = disk.queue().unwrap();
    q.run(RequestOp::Write, 0, IoMemory::Owned(vec![1; 4096]))
        .unwrap();
    let size = run(Command::new("nbdinfo").args(["--size", &server.uri()]));
    assert_eq!(size.trim(), SIZE.to_string());
    let out = dir.path().join("b.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw", &server.uri()])
        .arg(&out));
    let got = std::fs::read(&out).unwrap();
    assert_eq!(got[0], 1, "the instant's first byte");
    assert_ne!(got[..4096], vec![1u8; 4096][..]);
    server.stop();
    disk.live().set_cbw(None);
}
