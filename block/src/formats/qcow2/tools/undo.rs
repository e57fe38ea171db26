//! Undoing an image-tool operation that failed half-way, so a failed
//! command leaves the image file as it was: qcow2's `FailureUndo` (in
//! `tools`), with an [`UndoLog`] around the operation. `ch-img snapshot`,
//! `rebase`, `commit` and `resize` run their changes in it, and amend and
//! the persistent-bitmap changes always do (`tools`): it is the one way a
//! failed tool operation puts the file back.
//!
//! Everything the image still caches is written first, and the file cut
//! to the end of its clusters. Then the
//! operation runs with an [`UndoIo`] in front of the image's metadata-I/O
//! seam: before each write lands on bytes the file held when the
//! operation began, those bytes are read and kept. If the operation fails
//! (ENOSPC, EIO at any write or barrier), the kept bytes are written back
//! newest first, the file is cut back to its old length (which drops
//! every cluster the operation appended) and made durable, and the
//! image's tables are loaded again from the file. If that fails too, the
//! open image refuses every later write. Bytes written outside the seam
//! are not kept: guest data an operation writes into a free cluster
//! inside the file (never read back: after the undo no table points at
//! it) is the one difference that can remain.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::{fs, io};

use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{set_len, MetaIo, MetaKind};
use crate::formats::qcow2::on_disk::header::read_header_in;
use crate::formats::qcow2::state::State;

/// The bytes the operation overwrote, oldest first.
struct Saved {
    /// The file's length when the operation began.
    old_len: u64,
    writes: Mutex<Vec<(u64, MetaKind, Vec<u8>)>>,
}

/// A [`MetaIo`] that keeps what each write overwrites.
struct UndoIo {
    inner: Arc<dyn MetaIo>,
    saved: Arc<Saved>,
}

impl MetaIo for UndoIo {
    fn read_at(&self, kind: MetaKind, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(kind, buf, offset)
    }

    fn write_at(&self, kind: MetaKind, buf: &[u8], offset: u64) -> io::Result<usize> {
        if offset < self.saved.old_len {
            let kept = (self.saved.old_len - offset).min(buf.len() as u64) as usize;
            let mut old = vec![0u8; kept];
            crate::formats::qcow2::metadata::meta_io::read_at(&*self.inner, kind, offset, &mut old)
                .map_err(|e| io::Error::other(e.to_string()))?;
            self.saved
                .writes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((offset, kind, old));
        }
        self.inner.write_at(kind, buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }

    /// Not kept: the undo cuts the file back to its old length anyway.
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

/// The undo of one operation: started before it, finished after it.
pub(crate) struct UndoLog {
    /// The seam the recording one was put in front of.
    inner: Arc<dyn MetaIo>,
    saved: Arc<Saved>,
}

impl UndoLog {
    /// Makes everything `meta` caches durable and cuts the file to the
    /// end of its clusters (the headroom kept for allocation is a hole
    /// the undo would otherwise have to put back), then puts the
    /// recording seam in front of its metadata I/O.
    pub fn start(meta: &mut MetaState) -> Result<Self, BlockError> {
        meta.flush_dirty()?;
        meta.barrier()?;
        meta.trim_reserve()?;
        let inner = Arc::clone(meta.io());
        let saved = Arc::new(Saved {
            old_len: file_len(meta.file(), meta.path())?,
            writes: Mutex::new(Vec::new()),
        });
        meta.replace_io(Arc::new(UndoIo {
            inner: Arc::clone(&inner),
            saved: Arc::clone(&saved),
        }));
        Ok(UndoLog { inner, saved })
    }

    /// Takes the recording seam away again. If the operation `failed`,
    /// puts the file back as it was and reloads the image's tables and
    /// feature bits (`st`) and its disk size from it; if that fails too,
    /// the image refuses every later write.
    pub fn finish(self, st: &mut State, size: &AtomicU64, failed: bool) {
        st.meta.replace_io(Arc::clone(&self.inner));
        if !failed {
            return;
        }
        let path = st.meta.path().to_path_buf();
        let file = Arc::clone(st.meta.file());
        let reloaded = restore(&*self.inner, &file, &self.saved, &path).and_then(|()| {
            let file_size = file_len(&file, &path)?;
            let header = read_header_in(&*self.inner, file_size, &path, true)?;
            let io = Arc::clone(&self.inner);
            let mut meta =
                MetaState::load(&header, Arc::clone(&file), io, path.clone(), file_size)?;
            meta.copy_settings_from(&st.meta);
            Ok((meta, header.size, header.incompatible))
        });
        match reloaded {
            Ok((meta, disk_size, incompatible)) => {
                st.meta = meta;
                st.incompatible = incompatible;
                size.store(disk_size, Ordering::Release);
            }
            Err(undo) => {
                log::error!(
                    "{}: could not undo a failed operation ({undo}); refusing further writes",
                    path.display()
                );
                st.meta.refuse_writes();
            }
        }
    }
}

/// Writes the kept bytes back (newest first), cuts the file to its old
/// length and syncs it. Only the bytes that differ now are written: an
/// undo on a full file system must not need space (a write of zeroes
/// into a hole would).
fn restore(
    io: &dyn MetaIo,
    file: &fs::File,
    saved: &Saved,
    path: &std::path::Path,
) -> Result<(), BlockError> {
    let writes = std::mem::take(&mut *saved.writes.lock().unwrap_or_else(|p| p.into_inner()));
    for (offset, kind, old) in writes.iter().rev() {
        let mut now = vec![0u8; old.len()];
        crate::formats::qcow2::metadata::meta_io::read_at(io, *kind, *offset, &mut now)?;
        let mut at = 0;
        while let Some(from) = (at..old.len()).find(|&i| old[i] != now[i]) {
            let to = (from..old.len())
                .find(|&i| old[i] == now[i])
                .unwrap_or(old.len());
            crate::formats::qcow2::metadata::meta_io::write_at(
                io,
                *kind,
                offset + from as u64,
                &old[from..to],
            )?;
            at = to;
        }
    }
    if file_len(file, path)? != saved.old_len {
        set_len(io, saved.old_len, "undoing a failed operation")?;
    }
    crate::formats::qcow2::metadata::meta_io::sync(io)
}

fn file_len(file: &fs::File, path: &std::path::Path) -> Result<u64, BlockError> {
    crate::formats::holes::file_size(file).map_err(|source| BlockError::Open {
        path: path.to_owned(),
        source,
    })
}
