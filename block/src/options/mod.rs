//! How a disk is opened: the user-facing knobs shared by `--disk`,
//! `ch-storage-daemon --image` and `ch-img`.
//!
//! [`take_image_options`] reads the keys every binary shares from a
//! `key=value` list (`ch_util::kv`) into a [`DiskOptions`], by the rules
//! between them that the VMM's JSON disk config follows too ([`rules`]);
//! each binary then takes its own keys from the same list.

use std::path::PathBuf;
use std::str::FromStr;

mod cache;
pub mod rules;

pub use cache::CacheMode;
use ch_util::kv::{parse_on_off, KvError, KvList};
use rules::{CacheKeys, KeyConflict};

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
    /// io_uring when the kernel offers a ring with every opcode we use;
    /// else aio on O_DIRECT images that are fully allocated; else threads.
    /// Resolved once, at open, by [`crate::io::probe`].
    #[default]
    Auto,
    IoUring,
    /// Linux native AIO (needs O_DIRECT to be asynchronous).
    Aio,
    /// A pool of worker threads per disk.
    Threads,
    Sync,
}

impl EngineKind {
    pub const ALL: [EngineKind; 5] = [
        EngineKind::Auto,
        EngineKind::IoUring,
        EngineKind::Aio,
        EngineKind::Threads,
        EngineKind::Sync,
    ];

    /// The name `engine=` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::IoUring => "io_uring",
            EngineKind::Aio => "aio",
            EngineKind::Threads => "threads",
            EngineKind::Sync => "sync",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!("unknown engine '{s}' (expected auto, io_uring, aio, threads or sync)")
            })
    }
}

/// Everything needed to open a disk image.
#[derive(Clone, Debug, Default)]
pub struct DiskOptions {
    pub path: PathBuf,
    pub readonly: bool,
    /// O_DIRECT on every file of the image. `cache=` sets it (and
    /// [`take_image_options`] refuses a `direct=` that disagrees).
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
/// image's table by `formats::qcow2::snapshot_view`).
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

/// Whether an image path is an NBD URI (`nbd://HOST[:PORT]/NAME`,
/// `nbd+unix:///NAME?socket=PATH`): opened through `crate::nbd`.
pub fn is_nbd_path(path: &std::path::Path) -> bool {
    path.to_str().is_some_and(nbd::client::NbdUri::looks_like)
}

/// Takes the image keys shared by `--disk` and `--image` from `kv`:
/// `path` (required), `readonly`, `direct`, `cache`, `image_type`,
/// `engine` and `reconnect_delay` (NBD paths only). Other keys stay in
/// `kv` for the caller.
///
/// Refused, by the rules every way in shares ([`rules`]): a `direct`
/// that disagrees with `cache` (naming both), `engine=aio` without
/// O_DIRECT (QEMU's aio=native needs cache.direct=on), a
/// `reconnect_delay` out of range or on a path that is not NBD.
pub fn take_image_options(kv: &mut KvList) -> Result<DiskOptions, KvError> {
    let option = kv.option();
    let conflict = |c: KeyConflict| KvError::Conflict {
        option,
        first: c.first,
        second: c.second,
        reason: c.reason,
    };
    let path = kv.take_required("path")?;
    if path.is_empty() {
        return Err(KvError::BadValue {
            option,
            key: "path".into(),
            value: path,
            reason: "empty path".into(),
        });
    }
    let mut options = DiskOptions::new(path);
    if let Some(v) = kv.take_parsed("readonly", parse_on_off)? {
        options.readonly = v;
    }
    let keys = CacheKeys {
        direct: kv.take_parsed("direct", parse_on_off)?,
        cache: kv.take_parsed("cache", |s| s.parse::<CacheMode>())?,
    };
    options.cache = keys.mode().map_err(conflict)?;
    options.direct = options.cache.direct();
    if let Some(v) = kv.take_parsed("image_type", |s| s.parse::<ImageType>())? {
        options.image_type = v;
    }
    if let Some(v) = kv.take_parsed("engine", |s| s.parse::<EngineKind>())? {
        options.engine = v;
    }
    let nbd = is_nbd_path(&options.path);
    if let Some(v) = kv.take_parsed("reconnect_delay", |s| {
        let delay = s
            .parse::<u64>()
            .map_err(|_| rules::reconnect_delay_range())?;
        rules::check_reconnect_delay(delay, nbd)
    })? {
        options.reconnect_delay = v;
    }
    if options.engine == EngineKind::Aio {
        keys.check_aio().map_err(conflict)?;
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_keys_leave_the_rest() {
        let mut kv = KvList::parse(
            "--image",
            "path=/a.qcow2,readonly=on,direct=on,image_type=qcow2,engine=sync,num_queues=2",
        )
        .unwrap();
        let o = take_image_options(&mut kv).unwrap();
        assert_eq!(o.path, PathBuf::from("/a.qcow2"));
        assert!(o.readonly && o.direct && o.lock);
        assert_eq!(
            (o.image_type, o.engine),
            (ImageType::Qcow2, EngineKind::Sync)
        );
        assert_eq!(kv.take("num_queues").unwrap().as_deref(), Some("2"));
        kv.finish().unwrap();
    }

    #[test]
    fn engine_names_round_trip_and_the_error_lists_them_all() {
        for k in EngineKind::ALL {
            assert_eq!(k.as_str().parse::<EngineKind>(), Ok(k));
        }
        let err = "native".parse::<EngineKind>().unwrap_err();
        for name in ["'native'", "auto", "io_uring", "aio", "threads", "sync"] {
            assert!(err.contains(name), "{err}");
        }
    }

    fn parse(s: &str) -> Result<DiskOptions, KvError> {
        let mut kv = KvList::parse("--disk", s)?;
        let o = take_image_options(&mut kv)?;
        kv.finish()?;
        Ok(o)
    }

    #[test]
    fn cache_modes_set_direct() {
        for (mode, direct) in [
            ("none", true),
            ("writeback", false),
            ("writethrough", false),
            ("directsync", true),
            ("unsafe", false),
        ] {
            let o = parse(&format!("path=/a,cache={mode}")).unwrap();
            assert_eq!(o.cache.as_str(), mode);
            assert_eq!(o.direct, direct, "{mode}");
        }
        let o = parse("path=/a,direct=on").unwrap();
        assert_eq!((o.direct, o.cache), (true, CacheMode::None));
        let o = parse("path=/a,direct=off,cache=writethrough").unwrap();
        assert_eq!((o.direct, o.cache), (false, CacheMode::Writethrough));
        let o = parse("path=/a").unwrap();
        assert_eq!((o.direct, o.cache), (false, CacheMode::Writeback));
    }

    #[test]
    fn a_direct_that_disagrees_with_cache_names_both() {
        for s in [
            "path=/a,direct=on,cache=writeback",
            "path=/a,direct=off,cache=none",
        ] {
            let err = parse(s).unwrap_err();
            assert!(matches!(err, KvError::Conflict { .. }), "{err}");
            let msg = err.to_string();
            assert!(msg.contains("direct=") && msg.contains("cache="), "{msg}");
        }
    }

    #[test]
    fn unknown_cache_mode_names_the_key_and_the_values() {
        let msg = parse("path=/a,cache=nocache").unwrap_err().to_string();
        for word in [
            "cache",
            "nocache",
            "none",
            "writeback",
            "writethrough",
            "directsync",
            "unsafe",
        ] {
            assert!(msg.contains(word), "{msg}");
        }
        let msg = parse("path=/a,engine=native").unwrap_err().to_string();
        for word in [
            "engine", "native", "auto", "io_uring", "aio", "threads", "sync",
        ] {
            assert!(msg.contains(word), "{msg}");
        }
    }

    #[test]
    fn aio_needs_o_direct() {
        for (s, names) in [
            ("path=/a,engine=aio", "cache=writeback (the default)"),
            (
                "path=/a,engine=aio,cache=writethrough",
                "cache=writethrough",
            ),
            ("path=/a,engine=aio,cache=unsafe", "cache=unsafe"),
            ("path=/a,engine=aio,direct=off", "direct=off"),
        ] {
            let msg = parse(s).unwrap_err().to_string();
            assert!(msg.contains("engine=aio") && msg.contains(names), "{msg}");
        }
        for s in [
            "path=/a,engine=aio,cache=none",
            "path=/a,engine=aio,cache=directsync",
            "path=/a,engine=aio,direct=on",
        ] {
            let o = parse(s).unwrap();
            assert!(o.direct && o.engine == EngineKind::Aio);
        }
    }

    #[test]
    fn path_is_required_and_not_empty() {
        let mut kv = KvList::parse("--image", "readonly=on").unwrap();
        assert!(matches!(
            take_image_options(&mut kv),
            Err(KvError::MissingKey { key: "path", .. })
        ));
        let mut kv = KvList::parse("--image", "path=").unwrap();
        assert!(take_image_options(&mut kv).is_err());
    }
}
