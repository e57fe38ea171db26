//! The FUSE export: the image's guest view as a regular file, with
//! qemu-storage-daemon's semantics.

use std::path::PathBuf;

use block::options::kv::{parse_on_off, KvError, KvList};
use block::Disk;

use super::{Export, ExportError};

/// `allow_other=on|off|auto`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllowOther {
    On,
    Off,
    /// Try `allow_other`, mount without it when that is refused.
    #[default]
    Auto,
}

/// `--export type=fuse,...`.
// Read once the export is built (the skeleton only parses them).
#[allow(dead_code)]
#[derive(Clone, Debug)]
pub struct FuseConfig {
    pub mountpoint: PathBuf,
    pub writable: bool,
    pub growable: bool,
    pub allow_other: AllowOther,
    pub io_uring: bool,
    pub num_queues: u16,
}

/// Most FUSE queues (threads) per export.
pub const MAX_QUEUES: u16 = 64;

impl FuseConfig {
    pub fn from_kv(kv: &mut KvList) -> Result<Self, KvError> {
        let mountpoint = kv.take("mountpoint")?.ok_or(KvError::MissingKey {
            option: kv.option(),
            key: "mountpoint",
        })?;
        Ok(FuseConfig {
            mountpoint: PathBuf::from(mountpoint),
            writable: kv.take_parsed("writable", parse_on_off)?.unwrap_or(false),
            growable: kv.take_parsed("growable", parse_on_off)?.unwrap_or(false),
            allow_other: kv
                .take_parsed("allow_other", |s| match s {
                    "on" | "true" => Ok(AllowOther::On),
                    "off" | "false" => Ok(AllowOther::Off),
                    "auto" => Ok(AllowOther::Auto),
                    _ => Err("expected on, off or auto".to_string()),
                })?
                .unwrap_or_default(),
            io_uring: kv.take_parsed("io_uring", parse_on_off)?.unwrap_or(false),
            num_queues: kv
                .take_parsed("num_queues", |s| match s.parse::<u16>() {
                    Ok(n) if (1..=MAX_QUEUES).contains(&n) => Ok(n),
                    _ => Err(format!("expected a number from 1 to {MAX_QUEUES}")),
                })?
                .unwrap_or(1),
        })
    }
}

/// Mounts the export and starts its queue threads.
pub fn start(_disk: &Disk, config: FuseConfig) -> Result<Box<dyn Export>, ExportError> {
    Err(ExportError::Fuse {
        mountpoint: config.mountpoint.display().to_string(),
        reason: "the FUSE export is not built yet".into(),
    })
}
