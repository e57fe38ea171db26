//! [`ImageFiles`]: the files of an opened image chain, as its plans name
//! them ([`FileId`]) and its queues' engines open them.
//!
//! A file is local (a descriptor the file engines dup per queue) or
//! remote (an NBD export, reached through its connections). The local
//! files come first, `0..n`, so each file engine keeps its own
//! numbering; the remote ones follow, `n..`, and a queue's engine routes
//! their ops to the export's NBD engine ([`crate::factory::queue_engine`]).
//! A format builds this once, at open, and never changes it.

use std::fs::File;
use std::sync::Arc;

use crate::align::{file_alignment, DioAlign};
use crate::engine::FileId;
use crate::nbd::NbdFile;

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct ImageFiles {
    local: Vec<Arc<File>>,
    remote: Vec<Arc<NbdFile>>,
}

impl ImageFiles {
    /// `local` are files `0..local.len()`, `remote` the ones after.
    pub fn new(local: Vec<Arc<File>>, remote: Vec<Arc<NbdFile>>) -> Self {
        ImageFiles { local, remote }
    }

    /// The local files, by id.
    pub fn local(&self) -> &[Arc<File>] {
        &self.local
    }

    /// The remote files, in id order after the local ones.
    pub fn remote_files(&self) -> &[Arc<NbdFile>] {
        &self.remote
    }

    /// The remote file `id` names, `None` for a local file (or none).
    pub fn remote(&self, id: FileId) -> Option<&Arc<NbdFile>> {
        usize::from(id.0)
            .checked_sub(self.local.len())
            .and_then(|i| self.remote.get(i))
    }

    /// How many files, local and remote.
    pub fn len(&self) -> usize {
        self.local.len() + self.remote.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What O_DIRECT needs of each file's I/O, by id (a remote file has
    /// no constraint).
    pub fn alignments(&self) -> Vec<DioAlign> {
        self.local
            .iter()
            .map(|f| file_alignment(f))
            .chain(std::iter::repeat_n(DioAlign::NONE, self.remote.len()))
            .collect()
    }
}
