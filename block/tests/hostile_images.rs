//! Hostile qcow2 images: each is a valid qemu-img image with a few bytes
//! made wrong. Opening and reading each must give a clear error, never a
//! panic, a huge allocation or a hang; `check_image` must not panic
//! either. Every attempt runs in a thread with a time limit.

mod support;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use block::check::check_image;
use block::{BlockError, Disk, DiskOptions, ImageType};
use support::*;

const LIMIT: Duration = Duration::from_secs(20);

/// A 4 MiB qcow2 image with some data, made by qemu-img.
fn base_image(dir: &TempDir, name: &str) -> String {
    let img = dir.file(name);
    qemu_create("qcow2", &img, "4M", "");
    qemu_io("qcow2", Path::new(&img), &["write -P 0x5a 0 128k"]);
    img
}

fn poke(path: &str, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

fn be64(path: &str, offset: u64) -> u64 {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, offset).unwrap();
    u64::from_be_bytes(b)
}

/// Opens and reads the image in a thread with a time limit; returns the
/// first error. Panics (with the case name) on a panic, a hang, or success.
fn expect_error(case: &str, path: &str) -> BlockError {
    let p = PathBuf::from(path);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let result = (|| {
            let mut opts = DiskOptions::new(&p);
            opts.readonly = true;
            opts.image_type = ImageType::Format("qcow2");
            let disk = Disk::open(&opts)?;
            let size = disk.size().min(4 << 20);
            let mut buf = vec![0u8; 64 << 10];
            let mut off = 0;
            while off < size {
                let n = (size - off).min(buf.len() as u64) as usize;
                disk.read_at(off, &mut buf[..n])?;
                disk.format().block_status(off, n as u64)?;
                off += n as u64;
            }
            Ok(())
        })();
        let _ = tx.send(result);
    });
    match rx.recv_timeout(LIMIT) {
        Ok(Err(e)) => e,
        Ok(Ok(())) => panic!("{case}: the hostile image opened and read without an error"),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{case}: open/read hung for {LIMIT:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{case}: open/read panicked"),
    }
}

/// `check_image` finishes in time without panicking (an error or a
/// report of corruption are both fine).
fn check_does_not_panic(case: &str, path: &str) {
    let p = PathBuf::from(path);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = check_image(Path::new(&p), None).map(|r| r.corruptions);
        let _ = tx.send(r.is_ok());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(_) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{case}: check hung"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{case}: check panicked"),
    }
}

fn hostile(case: &str, build: impl FnOnce(&TempDir) -> String, expect: &str) {
    let dir = temp_dir(case);
    let img = build(&dir);
    let err = expect_error(case, &img);
    let msg = format!("{err}: {}", err.source_chain());
    assert!(
        msg.to_lowercase().contains(expect),
        "{case}: error should mention {expect:?}, got: {msg}"
    );
    check_does_not_panic(case, &img);
}

trait SourceChain {
    fn source_chain(&self) -> String;
}

impl SourceChain for BlockError {
    fn source_chain(&self) -> String {
        let mut s = String::new();
        let mut cur = std::error::Error::source(self);
        while let Some(e) = cur {
            s.push_str(&e.to_string());
            s.push_str(": ");
            cur = e.source();
        }
        s
    }
}

#[test]
fn truncated_header() {
    hostile(
        "truncated-header",
        |d| {
            let img = base_image(d, "t.qcow2");
            std::fs::OpenOptions::new()
                .write(true)
                .open(&img)
                .unwrap()
                .set_len(50)
                .unwrap();
            img
        },
        "header",
    );
}

#[test]
fn l1_table_beyond_end_of_file() {
    hostile(
        "l1-beyond-eof",
        |d| {
            let img = base_image(d, "l1.qcow2");
            poke(&img, 40, &(1u64 << 40).to_be_bytes());
            img
        },
        "l1",
    );
}

#[test]
fn refcount_table_over_the_header() {
    hostile(
        "reftable-header",
        |d| {
            let img = base_image(d, "rt.qcow2");
            poke(&img, 48, &0u64.to_be_bytes());
            img
        },
        "refcount table",
    );
}

#[test]
fn absurd_l1_size() {
    hostile(
        "absurd-l1",
        |d| {
            let img = base_image(d, "l1size.qcow2");
            poke(&img, 36, &u32::MAX.to_be_bytes());
            img
        },
        "l1",
    );
}

#[test]
fn cluster_bits_out_of_range() {
    for bits in [8u32, 22, 63] {
        hostile(
            &format!("cluster-bits-{bits}"),
            |d| {
                let img = base_image(d, "cb.qcow2");
                poke(&img, 20, &bits.to_be_bytes());
                img
            },
            "cluster",
        );
    }
}

#[test]
fn backing_chain_that_loops() {
    hostile(
        "backing-loop",
        |d| {
            let a = d.file("a.qcow2");
            let b = d.file("b.qcow2");
            qemu_img(&[
                "create", "-q", "-f", "qcow2", "-u", "-b", "b.qcow2", "-F", "qcow2", &a, "1M",
            ]);
            qemu_img(&[
                "create", "-q", "-f", "qcow2", "-u", "-b", "a.qcow2", "-F", "qcow2", &b, "1M",
            ]);
            a
        },
        "backing",
    );
}

#[test]
fn backing_path_is_a_directory() {
    hostile(
        "backing-dir",
        |d| {
            std::fs::create_dir_all(d.join("somedir")).unwrap();
            let a = d.file("a.qcow2");
            qemu_img(&[
                "create", "-q", "-f", "qcow2", "-u", "-b", "somedir", "-F", "raw", &a, "1M",
            ]);
            a
        },
        "somedir",
    );
}

#[test]
fn garbage_in_a_compressed_cluster() {
    hostile(
        "compressed-garbage",
        |d| {
            let src = base_image(d, "src.qcow2");
            let img = d.file("c.qcow2");
            qemu_img(&["convert", "-c", "-O", "qcow2", &src, &img]);
            // The first L2 entry is a compressed descriptor: overwrite the
            // bytes it points at.
            let l1 = be64(&img, 40);
            let l2 = be64(&img, l1) & 0x00ff_ffff_ffff_fe00;
            let entry = be64(&img, l2);
            assert!(entry & (1 << 62) != 0, "expected a compressed cluster");
            let host = entry & ((1u64 << 54) - 1);
            poke(&img, host, &[0xff; 512]);
            img
        },
        "compress",
    );
}

#[test]
fn huge_refcount_table() {
    hostile(
        "huge-reftable",
        |d| {
            let img = base_image(d, "hr.qcow2");
            poke(&img, 56, &u32::MAX.to_be_bytes());
            img
        },
        "refcount table",
    );
}

#[test]
fn l2_offset_pointing_into_the_header() {
    hostile(
        "l2-in-header",
        |d| {
            let img = base_image(d, "l2h.qcow2");
            let l1 = be64(&img, 40);
            poke(&img, l1, &(0x200u64 | (1 << 63)).to_be_bytes());
            img
        },
        "l2",
    );
}
