//! Images preallocated by `block::create` (`metadata`: mapped clusters
//! over holes; `falloc`: fallocated; `full`: zero-written) on every
//! engine: the conformance body's writes, zeroes, discards and flushes
//! read back right and leave `qemu-img check` clean (a cluster handed out
//! twice would show as a refcount error), and plain writes over the whole
//! disk land in the preallocated clusters: qemu-img map's host offsets and
//! the file's length do not change.

mod engine_support;
mod support;

use block::create::{create_image, CreateOptions};
use block::prealloc::Preallocation;
use block::{Disk, DiskOptions, EngineKind, ImageType};
use engine_support::conformance as body;
use engine_support::{run_batch, write_req};
use support::*;

const SIZE: u64 = 4 << 20;

const MODES: [Preallocation; 3] = [
    Preallocation::Metadata,
    Preallocation::Falloc,
    Preallocation::Full,
];

const ENGINES: [EngineKind; 4] = [
    EngineKind::Sync,
    EngineKind::Threads,
    EngineKind::Aio,
    EngineKind::IoUring,
];

fn make(dir: &TempDir, mode: Preallocation) -> std::path::PathBuf {
    let path = dir.join(format!("img-{mode}.qcow2"));
    create_image(&CreateOptions {
        path: path.clone(),
        format: ImageType::Format("qcow2"),
        size: SIZE,
        preallocation: mode,
        ..Default::default()
    })
    .unwrap();
    qemu_img(&["check", "-q", s(&path)]);
    path
}

fn open(path: &std::path::Path, engine: EngineKind) -> Disk {
    let mut o = DiskOptions::new(path);
    o.image_type = ImageType::Format("qcow2");
    o.engine = engine;
    o.direct = true;
    Disk::open(&o).unwrap()
}

/// The host offset of every 64 KiB guest cluster, from
/// `qemu-img map --output=json` (whose extents merge or split as the zero
/// and data flags change, so compare per cluster).
fn host_offsets(path: &std::path::Path) -> Vec<Option<u64>> {
    let out = qemu_img(&["map", "--output=json", s(path)]);
    let field = |entry: &str, name: &str| -> Option<u64> {
        let at = entry.find(&format!("\"{name}\": "))? + name.len() + 4;
        let digits: String = entry[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let mut clusters = vec![None; (SIZE / 65536) as usize];
    for entry in out.split('}') {
        let (Some(start), Some(len)) = (field(entry, "start"), field(entry, "length")) else {
            continue;
        };
        if let Some(offset) = field(entry, "offset") {
            for c in (start..start + len).step_by(65536) {
                clusters[(c / 65536) as usize] = Some(offset + (c - start));
            }
        }
    }
    clusters
}

#[test]
fn the_conformance_body_on_preallocated_images() {
    for mode in MODES {
        for engine in ENGINES {
            let dir = temp_dir("prealloc-body");
            let path = make(&dir, mode);
            let disk = open(&path, engine);
            let seed = 0x9e11 ^ engine as u64 ^ (mode as u64) << 8;
            let model = body::exercise(&disk, vec![0u8; SIZE as usize], seed);
            disk.close().unwrap();
            drop(disk);
            qemu_img(&["check", "-q", s(&path)]);
            qemu_compare_to_model(&dir, &path, "qcow2", &model);
        }
    }
}

#[test]
fn writes_land_in_the_preallocated_clusters() {
    for mode in MODES {
        for engine in ENGINES {
            let dir = temp_dir("prealloc-writes");
            let path = make(&dir, mode);
            let before = host_offsets(&path);
            assert!(
                before.iter().all(Option::is_some),
                "{mode}: every cluster mapped"
            );
            let len_before = std::fs::metadata(&path).unwrap().len();
            let disk = open(&path, engine);
            let mut q = disk.queue().unwrap();
            // Every 64 KiB cluster, 32 at a time, in a scrambled order.
            let mut rng = Rng::new(7 + engine as u64);
            let mut model = vec![0u8; SIZE as usize];
            let mut order: Vec<u64> = (0..SIZE / 65536).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for chunk in order.chunks(32) {
                let reqs = chunk
                    .iter()
                    .map(|&c| {
                        let mut data = vec![0u8; 65536];
                        rng.fill(&mut data);
                        model[(c * 65536) as usize..((c + 1) * 65536) as usize]
                            .copy_from_slice(&data);
                        write_req(c, c * 65536, data)
                    })
                    .collect();
                for c in run_batch(&mut q, reqs) {
                    assert!(c.result.is_ok(), "{mode} {engine}: {:?}", c.result);
                }
            }
            drop(q);
            disk.close().unwrap();
            drop(disk);
            qemu_img(&["check", "-q", s(&path)]);
            qemu_compare_to_model(&dir, &path, "qcow2", &model);
            let what = format!("{mode} on {engine}");
            assert_eq!(host_offsets(&path), before, "{what}: clusters moved");
            let len_after = std::fs::metadata(&path).unwrap().len();
            assert_eq!(len_after, len_before, "{what}: the file grew");
        }
    }
}

/// `ch-img resize --preallocation` (`block::prealloc::preallocate_grown`)
/// goes through the format's checked write path: on an image whose L2
/// table wrongly has refcount 0, the grown area's cluster would be handed
/// out on top of that table; the overlap check refuses it before any
/// zeroes or fallocate reach the file, and marks the image corrupt.
#[test]
fn grown_area_preallocation_never_overwrites_metadata() {
    use std::os::unix::fs::FileExt;
    for mode in MODES {
        let dir = temp_dir("prealloc-grow-overlap");
        let path = make(&dir, Preallocation::Off);
        let disk = open(&path, EngineKind::Sync);
        disk.write_at(0, &[0x5a; 65536]).unwrap();
        disk.close().unwrap();
        drop(disk);
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let be64 = |off: u64| {
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, off).unwrap();
            u64::from_be_bytes(b)
        };
        let mask = 0x00ff_ffff_ffff_fe00u64;
        let l2 = be64(be64(40) & mask) & mask;
        let refblock = be64(be64(48) & mask) & mask;
        assert_ne!(l2, 0, "the write allocated an L2 table");
        // Refcount order 4 (16-bit entries): zero the L2 table's entry.
        f.write_all_at(&[0, 0], refblock + (l2 / 65536) * 2)
            .unwrap();
        let mut table = vec![0u8; 65536];
        f.read_exact_at(&mut table, l2).unwrap();

        let mut o = DiskOptions::new(&path);
        o.image_type = ImageType::Format("qcow2");
        o.engine = EngineKind::Sync;
        o.direct = true;
        let image = block::ExclusiveImage::open(&o).unwrap();
        image.resizer().resize(SIZE + 65536).unwrap();
        let format = image.disk().format();
        let r =
            block::prealloc::preallocate_grown(format.as_ref(), &path, mode, SIZE, SIZE + 65536);
        let e = r.expect_err("the grown cluster would overwrite the L2 table");
        assert!(e.to_string().contains("overlaps"), "{mode}: {e}");
        let mut after = vec![0u8; 65536];
        f.read_exact_at(&mut after, l2).unwrap();
        assert!(after == table, "{mode}: the L2 table was written over");
        assert_ne!(be64(72) & 2, 0, "{mode}: the corrupt bit is set");
        drop(image);
    }
}
