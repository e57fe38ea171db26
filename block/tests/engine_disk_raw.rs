//! The blocking `Disk` helpers (a cached sync-engine queue) against
//! the raw format, buffered and O_DIRECT.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use block::{BlockError, Disk, DiskOptions, ImageType};
use support::{temp_dir, TempDir};

mod engine_support;
mod support;

fn temp_image(name: &str, size: u64) -> (TempDir, PathBuf) {
    let dir = temp_dir(name);
    let path = dir.path().join("disk.raw");
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(size).unwrap();
    (dir, path)
}

fn open(path: &PathBuf, direct: bool, image_type: ImageType) -> Disk {
    let mut o = DiskOptions::new(path);
    o.direct = direct;
    o.image_type = image_type;
    o.lock = false;
    Disk::open(&o).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn roundtrip(direct: bool) {
    let (_d, path) = temp_image("raw-roundtrip", 1 << 20);
    let disk = open(&path, direct, ImageType::RAW);
    assert_eq!(disk.size(), 1 << 20);
    // Aligned and unaligned offsets/lengths (the latter bounce under O_DIRECT).
    for (off, len, seed) in [
        (0u64, 4096usize, 1u8),
        (4096 * 3, 65536, 2),
        (1000, 3000, 3),
        (511, 1, 4),
        (65535, 70000, 5),
    ] {
        let data = pattern(len, seed);
        disk.write_at(off, &data).unwrap();
        let mut back = vec![0u8; len];
        disk.read_at(off, &mut back).unwrap();
        assert_eq!(back, data, "offset {off} len {len}");
        // The bytes reached the file.
        let f = std::fs::File::open(&path).unwrap();
        let mut raw = vec![0u8; len];
        f.read_exact_at(&mut raw, off).unwrap();
        assert_eq!(raw, data);
    }
    // Neighbours of an unaligned write are preserved (read-modify-write).
    let mut around = vec![0u8; 8192];
    disk.read_at(0, &mut around).unwrap();
    assert_eq!(&around[..511], &pattern(4096, 1)[..511]);
    assert_eq!(around[511], 4);
    assert_eq!(&around[512..1000], &pattern(4096, 1)[512..1000]);
    disk.flush().unwrap();
    disk.close().unwrap();
}

#[test]
fn raw_roundtrip_buffered() {
    roundtrip(false);
}

#[test]
fn raw_roundtrip_direct() {
    roundtrip(true);
}

#[test]
fn raw_write_zeroes_and_discard_read_back_zero() {
    for direct in [false, true] {
        let (_d, path) = temp_image("raw-zero", 1 << 20);
        let disk = open(&path, direct, ImageType::RAW);
        disk.write_at(0, &vec![0xaa; 1 << 20]).unwrap();
        disk.write_zeroes(4096, 8192, false).unwrap();
        disk.write_zeroes(65536, 4096, true).unwrap();
        disk.discard(131072, 65536).unwrap();
        let mut back = vec![0u8; 1 << 20];
        disk.read_at(0, &mut back).unwrap();
        for (i, b) in back.iter().enumerate() {
            let zero = (4096..12288).contains(&i)
                || (65536..69632).contains(&i)
                || (131072..196608).contains(&i);
            assert_eq!(*b, if zero { 0 } else { 0xaa }, "byte {i} direct={direct}");
        }
    }
}

#[test]
fn out_of_range_fails_without_touching_the_file() {
    let (_d, path) = temp_image("raw-oor", 65536);
    let disk = open(&path, false, ImageType::RAW);
    let err = disk.write_at(65536 - 10, &[1u8; 20]).unwrap_err();
    assert!(matches!(err, BlockError::OutOfRange { .. }), "{err:?}");
    let mut buf = [0u8; 20];
    assert!(matches!(
        disk.read_at(65530, &mut buf),
        Err(BlockError::OutOfRange { .. })
    ));
    assert!(matches!(
        disk.read_at(u64::MAX - 2, &mut buf),
        Err(BlockError::OutOfRange { .. })
    ));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 65536);
    let f = std::fs::File::open(&path).unwrap();
    let mut tail = [0u8; 10];
    f.read_exact_at(&mut tail, 65526).unwrap();
    assert_eq!(tail, [0u8; 10]);
}

#[test]
fn probed_raw_refuses_an_image_header_in_sector_zero() {
    let (_d, path) = temp_image("raw-probe", 65536);
    let disk = open(&path, false, ImageType::Auto);
    let err = disk.write_at(0, b"QFI\xfb\0\0\0\x03").unwrap_err();
    assert!(
        matches!(err, BlockError::ProbedRawHeaderWrite { format: "qcow2" }),
        "{err:?}"
    );
    // Completing the magic byte by byte is refused too.
    disk.write_at(0, b"QF").unwrap();
    let err = disk.write_at(2, b"I\xfb").unwrap_err();
    assert!(
        matches!(err, BlockError::ProbedRawHeaderWrite { .. }),
        "{err:?}"
    );
    // Elsewhere it is just data; with an explicit format it is allowed.
    disk.write_at(512, b"QFI\xfb").unwrap();
    drop(disk);
    let disk = open(&path, false, ImageType::RAW);
    disk.write_at(0, b"QFI\xfb").unwrap();
    let mut back = [0u8; 4];
    disk.read_at(0, &mut back).unwrap();
    assert_eq!(&back, b"QFI\xfb");
}

#[test]
fn readonly_disk_refuses_writes() {
    let (_d, path) = temp_image("raw-ro", 65536);
    let mut o = DiskOptions::new(&path);
    o.readonly = true;
    o.lock = false;
    o.image_type = ImageType::RAW;
    let disk = Disk::open(&o).unwrap();
    assert!(matches!(disk.write_at(0, &[1]), Err(BlockError::ReadOnly)));
    let mut b = [9u8; 4];
    disk.read_at(0, &mut b).unwrap();
    assert_eq!(b, [0; 4]);
    disk.flush().unwrap();
}

#[test]
fn logical_block_size_reflects_direct() {
    let (_d, path) = temp_image("raw-lbs", 65536);
    assert_eq!(open(&path, false, ImageType::RAW).logical_block_size(), 512);
    let direct = open(&path, true, ImageType::RAW).logical_block_size();
    assert!(direct.is_power_of_two() && direct >= 512, "{direct}");
}
