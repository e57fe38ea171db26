//! A tiny synchronous runner for format plans (the qcow2 tests drive a
//! `Format` directly, without an engine): opens an image with its tool
//! capabilities (`ImageTools`, as the image's owner), carries out read
//! and write plans with plain pread/pwrite, and keeps a raw reference file
//! in step for comparison.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use block::formats::{
    Format, HostWrite, ImageTools, PlanCache, ReadPlan, ReadSource, Waker, WriteData, WriteOutcome,
    WritePlan,
};
use block::options::{DiskOptions, ImageType};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub fn open(p: &Path, readonly: bool) -> Arc<dyn ImageTools> {
    let mut o = DiskOptions::new(p);
    o.readonly = readonly;
    o.image_type = ImageType::Auto;
    // Another test thread's child process may briefly hold a copy of a
    // just-closed descriptor (between fork and exec), and with it the lock.
    for _ in 0..200 {
        match block::formats::open_image_tools(&o) {
            Err(block::BlockError::Locked { .. }) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            r => return r.unwrap_or_else(|e| panic!("open {}: {e:?}", p.display())),
        }
    }
    panic!("{} stayed locked", p.display())
}

pub fn waker() -> Waker {
    Arc::new(EventFd::new(EFD_NONBLOCK).unwrap())
}

thread_local! {
    /// The plan cache of this test thread's "queue": kept from read to
    /// read (across writes, discards, snapshots and reopens), so every
    /// read also checks that qcow2's table snapshots give the plan the
    /// locked lookups give.
    static PLAN_CACHE: std::cell::RefCell<PlanCache> = Default::default();
}

pub fn read(f: &dyn Format, offset: u64, len: usize) -> Vec<u8> {
    let mut plan = ReadPlan::new();
    f.plan_read(offset, len as u64, &mut plan).unwrap();
    let mut cached = ReadPlan::new();
    PLAN_CACHE.with(|c| {
        f.plan_read_cached(&mut c.borrow_mut(), offset, len as u64, &mut cached)
            .unwrap()
    });
    assert_eq!(
        cached, plan,
        "plan through the queue's table snapshots at {offset}+{len}"
    );
    let files = f.files().local();
    let mut out = vec![0u8; len];
    let mut pos = 0usize;
    for p in plan {
        let dst = &mut out[pos..pos + p.len as usize];
        match p.source {
            ReadSource::Zero => dst.fill(0),
            ReadSource::Memory(m) => dst.copy_from_slice(m.slice(p.len).unwrap()),
            ReadSource::Host { file, offset } => pread(&files[file.0 as usize], offset, dst),
            ReadSource::Compressed(c) => {
                let mut input = vec![0u8; c.compressed_len as usize];
                pread(&files[c.file.0 as usize], c.host_offset, &mut input);
                let mut cluster = vec![0u8; c.cluster_size as usize];
                inflate(c.algorithm, &input, &mut cluster);
                let s = c.offset_in_cluster as usize;
                dst.copy_from_slice(&cluster[s..s + dst.len()]);
            }
        }
        pos += p.len as usize;
    }
    assert_eq!(pos, len, "plan covers the range");
    out
}

fn inflate(alg: block::formats::Compression, input: &[u8], out: &mut [u8]) {
    match alg {
        block::formats::Compression::Deflate => {
            let mut d = flate2::Decompress::new(false);
            let _ = d.decompress(input, out, flate2::FlushDecompress::Finish);
            assert_eq!(d.total_out() as usize, out.len());
        }
        block::formats::Compression::Zstd => {
            use std::io::Read;
            let mut dec = zstd::stream::read::Decoder::new(input)
                .unwrap()
                .single_frame();
            dec.read_exact(out).unwrap();
        }
    }
}

fn pread(f: &File, off: u64, buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], off + done as u64).unwrap();
        if n == 0 {
            buf[done..].fill(0);
            return;
        }
        done += n;
    }
}

/// Executes a write plan's ops with `data` as the request memory.
pub fn execute(f: &dyn Format, plan: &WritePlan, data: &[u8]) {
    let files = f.files().local();
    for op in &plan.ops {
        match op {
            HostWrite::Data {
                file,
                offset,
                parts,
            } => {
                let mut buf = Vec::new();
                for p in parts {
                    match p {
                        WriteData::Request { offset, len } => buf
                            .extend_from_slice(&data[*offset as usize..(*offset + *len) as usize]),
                        WriteData::Owned(v) => buf.extend_from_slice(v),
                        WriteData::Zeroes(n) => buf.resize(buf.len() + *n as usize, 0),
                    }
                }
                files[file.0 as usize].write_all_at(&buf, *offset).unwrap();
            }
            HostWrite::PunchHole { file, offset, len } => {
                // SAFETY: fallocate on an open descriptor with plain integers.
                let r = unsafe {
                    libc::fallocate(
                        files[file.0 as usize].as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        *offset as i64,
                        *len as i64,
                    )
                };
                assert_eq!(r, 0);
            }
            HostWrite::ZeroRange { file, offset, len } => {
                files[file.0 as usize]
                    .write_all_at(&vec![0u8; *len as usize], *offset)
                    .unwrap();
            }
        }
    }
}

fn finish(f: &dyn Format, outcome: WriteOutcome, data: &[u8]) {
    let WriteOutcome::Ready(plan) = outcome else {
        panic!("unexpectedly blocked")
    };
    execute(f, &plan, data);
    if let Some(c) = plan.commit {
        f.commit(c).unwrap();
    }
}

pub fn write(f: &dyn Format, offset: u64, data: &[u8]) {
    let o = f.plan_write(offset, data.len() as u64, &waker()).unwrap();
    finish(f, o, data);
}

pub fn discard(f: &dyn Format, offset: u64, len: u64) {
    let o = f.plan_discard(offset, len, &waker()).unwrap();
    finish(f, o, &[]);
}

pub fn write_zeroes(f: &dyn Format, offset: u64, len: u64, may_unmap: bool) {
    let o = f
        .plan_write_zeroes(offset, len, may_unmap, &waker())
        .unwrap();
    finish(f, o, &[]);
}

/// A reference raw file kept in step with the image under test.
pub struct Reference(pub File, pub PathBuf);

impl Reference {
    pub fn new(p: PathBuf, size: u64) -> Self {
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.set_len(size).unwrap();
        Reference(f, p)
    }
    pub fn write(&self, off: u64, data: &[u8]) {
        self.0.write_all_at(data, off).unwrap();
    }
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        pread(&self.0, off, &mut b);
        b
    }
}

/// Asserts that qemu-img finds `img` clean and equal to the reference.
pub fn qemu_verify(img: &Path, r: &Reference) {
    super::qemu::qemu_check(img);
    super::qemu::qemu_compare(img, &r.1);
}

/// Reads the first `len` bytes back through `f` and compares them with the
/// reference (`what` names the case), closes the image, then has qemu-img
/// check it and compare it with the reference.
pub fn close_and_verify(f: Arc<dyn Format>, img: &Path, r: &Reference, len: usize, what: &str) {
    super::rng::assert_same(&read(&*f, 0, len), &r.read(0, len), what);
    f.close().unwrap();
    drop(f);
    qemu_verify(img, r);
}
