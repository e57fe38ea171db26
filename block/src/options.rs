//! How a disk is opened: the user-facing knobs shared by `--disk` and `ch-img`.

use std::path::PathBuf;
use std::str::FromStr;

/// Which image format to expect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImageType {
    /// Probe the file's header. A probed raw image refuses writes to its
    /// first sector that would make it look like another format.
    #[default]
    Auto,
    Raw,
    Qcow2,
}

impl FromStr for ImageType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "raw" => Ok(Self::Raw),
            "qcow2" => Ok(Self::Qcow2),
            _ => Err(format!(
                "unknown image type '{s}' (expected auto, raw or qcow2)"
            )),
        }
    }
}

/// Which I/O engine executes the plans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring when the kernel offers a ring with every opcode we use,
    /// else sync. Resolved once, at open, by [`crate::io::probe`].
    #[default]
    Auto,
    IoUring,
    Sync,
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "io_uring" => Ok(Self::IoUring),
            "sync" => Ok(Self::Sync),
            _ => Err(format!(
                "unknown engine '{s}' (expected auto, io_uring or sync)"
            )),
        }
    }
}

/// Everything needed to open a disk image.
#[derive(Clone, Debug, Default)]
pub struct DiskOptions {
    pub path: PathBuf,
    pub readonly: bool,
    /// O_DIRECT on every file of the image (the `cache=none` of other VMMs).
    pub direct: bool,
    pub image_type: ImageType,
    pub engine: EngineKind,
    /// Take OFD locks (shared for read-only, exclusive for read-write) the
    /// way qemu does, so two writers cannot open one image.
    pub lock: bool,
    /// Do not open the backing chain: unallocated ranges read as zeroes.
    /// Read-only opens only (a write would copy zeroes instead of the
    /// backing data); for tools that read just what the image allocates
    /// while they write its backing file (`ch-img commit`).
    pub no_backing: bool,
}

impl DiskOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            lock: true,
            ..Default::default()
        }
    }
}
