//! The vhost-user-blk export: a vhost-user backend whose virtqueues are
//! served by virtio-devices' request parser and queue worker.
//!
//! Data enters as `--export type=vhost-user-blk,...` keys
//! ([`VhostUserBlkConfig::from_kv`]), which become a
//! [`BlockDeviceConfig`]; [`start`] binds the socket ([`server`]) and
//! each front end that connects gets a [`BlockDevice`] behind a
//! vhost-user backend ([`backend`]). Guest requests leave as block
//! requests on the image's `DiskQueue`s, exactly as in the VMM.
//!
//! [`BlockDevice`]: virtio_devices::block::BlockDevice

mod backend;
mod server;

use std::path::PathBuf;

use block::Disk;
use ch_util::kv::{parse_on_off, KvError, KvList};
use virtio_devices::block::BlockDeviceConfig;

use super::running::{Export, ExportError};

/// `--export type=vhost-user-blk,...`.
#[derive(Clone, Debug)]
pub struct VhostUserBlkConfig {
    pub socket: PathBuf,
    pub num_queues: u16,
    pub queue_size: u16,
    pub writable: bool,
    pub logical_block_size: u32,
    pub serial: Option<String>,
}

/// Most virtqueues per export.
pub const MAX_QUEUES: u16 = 64;
/// Largest split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// The GET_ID answer is at most 20 bytes.
pub const MAX_SERIAL: usize = 20;

impl VhostUserBlkConfig {
    pub fn from_kv(kv: &mut KvList) -> Result<Self, KvError> {
        let socket = kv.take_required("socket")?;
        Ok(VhostUserBlkConfig {
            socket: PathBuf::from(socket),
            num_queues: kv
                .take_parsed("num_queues", |s| match s.parse::<u16>() {
                    Ok(n) if (1..=MAX_QUEUES).contains(&n) => Ok(n),
                    _ => Err(format!("expected a number from 1 to {MAX_QUEUES}")),
                })?
                .unwrap_or(1),
            queue_size: kv
                .take_parsed("queue_size", |s| match s.parse::<u16>() {
                    Ok(n) if (2..=MAX_QUEUE_SIZE).contains(&n) && n.is_power_of_two() => Ok(n),
                    _ => Err(format!(
                        "expected a power of two from 2 to {MAX_QUEUE_SIZE}"
                    )),
                })?
                .unwrap_or(128),
            writable: kv.take_parsed("writable", parse_on_off)?.unwrap_or(false),
            logical_block_size: kv
                .take_parsed("logical_block_size", |s| match s.parse::<u32>() {
                    Ok(n) if (512..=65536).contains(&n) && n.is_power_of_two() => Ok(n),
                    _ => Err("expected a power of two from 512 to 65536".to_string()),
                })?
                .unwrap_or(512),
            serial: kv.take_parsed("serial", |s| {
                if s.len() > MAX_SERIAL || !s.bytes().all(|b| b.is_ascii_graphic()) {
                    Err(format!(
                        "expected at most {MAX_SERIAL} printable ASCII characters"
                    ))
                } else {
                    Ok(s.to_string())
                }
            })?,
        })
    }
}

impl VhostUserBlkConfig {
    /// The device every connection gets.
    fn device_config(&self) -> BlockDeviceConfig {
        BlockDeviceConfig {
            num_queues: self.num_queues,
            queue_size: self.queue_size,
            serial: self.serial.clone().unwrap_or_default().into_bytes(),
            logical_block_size: self.logical_block_size,
            physical_block_size: self.logical_block_size,
            readonly: !self.writable,
            ..Default::default()
        }
    }
}

/// Binds the socket and starts serving front ends.
pub fn start(disk: &Disk, config: VhostUserBlkConfig) -> Result<Box<dyn Export>, ExportError> {
    if config.writable && disk.readonly() {
        return Err(ExportError::VhostUserBlk {
            socket: config.socket.display().to_string(),
            reason: "writable=on needs an image opened for writing (--image readonly=off)".into(),
        });
    }
    let export = server::VhostUserBlkExport::start(disk, &config.socket, config.device_config())?;
    Ok(Box::new(export))
}
