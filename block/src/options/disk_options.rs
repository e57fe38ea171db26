//! The options an image is opened with ([`DiskOptions`]): which format
//! ([`ImageType`]), access mode, cache mode, engine, locking, which
//! snapshot to read ([`SnapshotRef`]). The formats read them; the front
//! ends fill them in (from `key=value` lists with
//! [`super::image_keys::take_image_options`]).

use std::path::PathBuf;

use block_engines::EngineKind;

use super::cache::CacheMode;

/// Which image format to expect: probe the file's header, or the format
/// registered under a name (`formats::registry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImageType {
    /// Probe the file's header. A probed raw image refuses writes to its
    /// first sector that would make it look like another format.
    #[default]
    Auto,
    /// The registered format of this name ("raw", "qcow2"). Front ends
    /// make one from a user's word through the registry, which refuses
    /// a name it does not know.
    Format(&'static str),
}

impl ImageType {
    /// Raw: the format of a file no other format claims, of an NBD
    /// export, and of a new image when none is named (qemu-img's
    /// default).
    pub const RAW: ImageType = ImageType::Format("raw");

    /// The format's name, `None` when it is probed.
    pub fn name(self) -> Option<&'static str> {
        match self {
            ImageType::Auto => None,
            ImageType::Format(name) => Some(name),
        }
    }
}

/// Everything needed to open a disk image.
#[derive(Clone, Debug, Default)]
pub struct DiskOptions {
    pub path: PathBuf,
    pub readonly: bool,
    /// O_DIRECT on every file of the image. `cache=` sets it (and
    /// [`super::take_image_options`] refuses a `direct=` that disagrees).
    pub direct: bool,
    /// QEMU's cache mode: besides O_DIRECT (see `direct`), whether the
    /// device starts with a volatile write cache and whether flushes reach
    /// the disk (`unsafe` ignores them).
    pub cache: CacheMode,
    pub image_type: ImageType,
    pub engine: EngineKind,
    /// Take OFD locks (shared for read-only, exclusive for read-write) the
    /// way qemu does, so two writers cannot open one image.
    pub lock: bool,
    /// Do not open the backing chain: unallocated ranges read as zeroes.
    /// For tools that read just what the image allocates while they write
    /// its backing file (`ch-img commit`), read the header of an image
    /// whose chain is broken (`info`), or only rewrite the header
    /// (`rebase -u`): a writable open refuses guest writes and resizing,
    /// which would copy zeroes instead of the backing data.
    pub no_backing: bool,
    /// A read-write open keeps the image's persistent dirty bitmaps
    /// valid (qcow2's "bitmaps" autoclear bit stays set) and refuses
    /// guest writes, which would go unrecorded in them: for tools that
    /// change the bitmaps or the format's options but never the disk's
    /// contents (`ch-img bitmap`, `ch-img amend`).
    pub keep_persistent_bitmaps: bool,
    /// A read-write open whose owner records every guest write in the
    /// persistent dirty bitmaps it loads (the VMM's live bitmaps,
    /// `ExclusiveImage::attach_persistent_bitmaps`): the bitmaps stay
    /// valid and guest writes are allowed.
    pub records_bitmaps: bool,
    /// qemu's `force-share` (`ch-img -U`): the read-only files of the
    /// image (all of them on a read-only open, the backing chain on a
    /// writable one) are locked so that others may still write them.
    pub force_share: bool,
    /// Read this internal snapshot instead of the active disk (read-only
    /// qcow2 opens; `ch-img convert -l`).
    pub snapshot: Option<SnapshotRef>,
    /// NBD exports (the image, or a backing file): seconds requests wait
    /// for a reconnection after the server went away, QEMU's
    /// `reconnect-delay` (0: they fail at once).
    pub reconnect_delay: u64,
}

impl DiskOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            lock: true,
            ..Default::default()
        }
    }

    /// Opens the file at `path` with these options' access mode
    /// (read-only or read-write, O_DIRECT when `direct`).
    pub fn open_file(&self) -> Result<std::fs::File, crate::error::BlockError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(!self.readonly);
        if self.direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(&self.path)
            .map_err(|source| crate::error::BlockError::Open {
                path: self.path.clone(),
                source,
            })
    }

    /// How the image's own files are locked (when `lock` is set).
    pub fn lock_mode(&self) -> crate::lock::LockMode {
        match (self.readonly, self.force_share) {
            (true, true) => crate::lock::LockMode::ForceShare,
            (readonly, _) => crate::lock::LockMode::of(!readonly),
        }
    }
}

/// Which internal snapshot a read-only qcow2 open reads instead of the
/// active disk, as qemu-img's `convert -l` names it (looked up in the
/// image's table by `formats::qcow2::tools::snapshot_view`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotRef {
    /// `-l NAME`: the snapshot with id NAME, else the first named NAME.
    IdOrName(String),
    /// `-l snapshot.id=ID,snapshot.name=NAME`: every field given matches.
    Fields {
        id: Option<String>,
        name: Option<String>,
    },
}
