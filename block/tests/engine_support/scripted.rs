//! A scripted format for executor tests: plans that split every range into
//! small pieces over up to two files, zero pieces, compressed clusters,
//! blocked writes, and counters for commit/abort.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use block::error::BlockError;
use block::formats::{
    BlockStatus, CompressedExtent, FileId, Format, HostWrite, ImageFiles, ImageInfo, ReadPiece,
    ReadPlan, ReadSource, Waker, WriteCommit, WriteData, WriteOutcome, WritePlan,
};

/// How guest ranges map to the files.
#[derive(Clone)]
pub enum Layout {
    /// Identity on file 0, split into `piece`-byte parts; writes carry a
    /// commit.
    Split { piece: u64 },
    /// Everything reads from file 1 at the same offset (a short backing
    /// file: past its end reads zeroes).
    Backing,
    /// Cluster `i` (of `cluster` bytes) is compressed with `algorithm` at
    /// `table[i]` in file 0, or zero when absent.
    Compressed {
        cluster: u32,
        table: Vec<Option<(u64, u64)>>,
        algorithm: block::formats::Compression,
    },
}

pub struct ScriptedFormat {
    pub files: ImageFiles,
    pub size: u64,
    pub layout: Layout,
    pub commits: AtomicU64,
    pub aborts: AtomicU64,
    /// plan_write answers Blocked this many times, waking the waker from
    /// another thread each time.
    pub block_writes: AtomicU64,
    pub blocked: AtomicU64,
    pub next_commit: AtomicU64,
    pub wakers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl ScriptedFormat {
    pub fn new(files: Vec<Arc<File>>, size: u64, layout: Layout) -> Self {
        ScriptedFormat {
            files: ImageFiles::new(files, Vec::new()),
            size,
            layout,
            commits: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
            block_writes: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            next_commit: AtomicU64::new(1),
            wakers: Mutex::new(Vec::new()),
        }
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(BlockError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }
}

impl Format for ScriptedFormat {
    fn size(&self) -> u64 {
        self.size
    }

    fn files(&self) -> &ImageFiles {
        &self.files
    }

    fn flush_files(&self) -> Vec<FileId> {
        vec![FileId(0)]
    }

    fn plan_read(&self, offset: u64, len: u64, plan: &mut ReadPlan) -> Result<(), BlockError> {
        self.check(offset, len)?;
        match &self.layout {
            Layout::Split { piece } => {
                let mut off = offset;
                while off < offset + len {
                    let n = (piece - off % piece).min(offset + len - off);
                    // Every third piece reads as zeroes.
                    let source = if (off / piece) % 3 == 2 {
                        ReadSource::Zero
                    } else {
                        ReadSource::Host {
                            file: FileId(0),
                            offset: off,
                        }
                    };
                    plan.push(ReadPiece { len: n, source });
                    off += n;
                }
            }
            Layout::Backing => plan.push(ReadPiece {
                len,
                source: ReadSource::Host {
                    file: FileId(1),
                    offset,
                },
            }),
            Layout::Compressed {
                cluster,
                table,
                algorithm,
            } => {
                let c = u64::from(*cluster);
                let mut off = offset;
                while off < offset + len {
                    let n = (c - off % c).min(offset + len - off);
                    let source = match table.get((off / c) as usize).copied().flatten() {
                        Some((host, clen)) => ReadSource::Compressed(CompressedExtent {
                            file: FileId(0),
                            host_offset: host,
                            compressed_len: clen,
                            algorithm: *algorithm,
                            cluster_size: *cluster,
                            offset_in_cluster: (off % c) as u32,
                        }),
                        None => ReadSource::Zero,
                    };
                    plan.push(ReadPiece { len: n, source });
                    off += n;
                }
            }
        }
        Ok(())
    }

    fn plan_write(&self, offset: u64, len: u64, waker: &Waker) -> Result<WriteOutcome, BlockError> {
        self.check(offset, len)?;
        if self.block_writes.load(Ordering::SeqCst) > 0 {
            self.block_writes.fetch_sub(1, Ordering::SeqCst);
            self.blocked.fetch_add(1, Ordering::SeqCst);
            let w = waker.clone();
            self.wakers
                .lock()
                .unwrap()
                .push(std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    w.write(1).unwrap();
                }));
            return Ok(WriteOutcome::Blocked);
        }
        let piece = match self.layout {
            Layout::Split { piece } => piece,
            _ => len.max(1),
        };
        let mut ops = Vec::new();
        let mut off = offset;
        while off < offset + len {
            let n = (piece - off % piece).min(offset + len - off);
            ops.push(HostWrite::Data {
                file: FileId(0),
                offset: off,
                parts: vec![WriteData::Request {
                    offset: off - offset,
                    len: n,
                }],
            });
            off += n;
        }
        Ok(WriteOutcome::Ready(WritePlan {
            ops,
            commit: Some(WriteCommit(self.next_commit.fetch_add(1, Ordering::SeqCst))),
            frees_clusters: false,
        }))
    }

    fn plan_discard(
        &self,
        offset: u64,
        len: u64,
        _waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.check(offset, len)?;
        Ok(WriteOutcome::Ready(WritePlan {
            ops: vec![HostWrite::PunchHole {
                file: FileId(0),
                offset,
                len,
            }],
            commit: None,
            frees_clusters: false,
        }))
    }

    fn plan_write_zeroes(
        &self,
        offset: u64,
        len: u64,
        _u: bool,
        _waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.check(offset, len)?;
        Ok(WriteOutcome::Ready(WritePlan {
            ops: vec![HostWrite::Data {
                file: FileId(0),
                offset,
                parts: vec![WriteData::Zeroes(len)],
            }],
            commit: None,
            frees_clusters: false,
        }))
    }

    fn commit(&self, _commit: WriteCommit) -> Result<(), BlockError> {
        self.commits.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn abort(&self, _commit: WriteCommit) {
        self.aborts.fetch_add(1, Ordering::SeqCst);
    }

    fn flush_metadata(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn block_status(&self, _offset: u64, len: u64) -> Result<BlockStatus, BlockError> {
        Ok(BlockStatus {
            len,
            depth: 0,
            present: true,
            zero: false,
            data: true,
            compressed: false,
            offset: None,
            file: None,
        })
    }

    fn info(&self) -> ImageInfo {
        ImageInfo {
            format: "scripted",
            virtual_size: self.size,
            ..Default::default()
        }
    }

    fn close(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        "scripted"
    }
}
