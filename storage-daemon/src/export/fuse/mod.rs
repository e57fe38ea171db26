//! The FUSE export: the image's guest view as a regular file, with
//! qemu-storage-daemon's semantics (docs/storage-daemon.md, "FUSE
//! export", lists them and the differences), over classic
//! /dev/fuse queues or FUSE-over-io_uring.
//!
//! The protocol layer is our own: no FUSE server crate speaks
//! FUSE-over-io_uring in a release (fuser, fuse3 and polyfuse have open
//! issues; fuse-backend-rs has it only in git), and an export of one
//! regular file needs a dozen opcodes, not a file system framework.
//!
//! [`start`] checks the mountpoint, mounts it ([`mount`]), answers
//! FUSE_INIT ([`init`]) and starts the queue threads: one per /dev/fuse
//! descriptor ([`devfuse`]) and, with `io_uring=on`, one per possible
//! CPU, each serving its CPU's ring queue and the next one ([`uring`]). Both transports hand
//! every request to the same [`handler::dispatch`]; data requests become
//! block requests on the thread's own disk queue ([`io`]), attributes
//! live in [`attr`], the kernel structs in [`abi`]; the request and reply
//! types they all share in [`request`] and [`reply`], the sizes asked
//! for at FUSE_INIT in [`limits`]. [`FuseExport::stop`]
//! unmounts, ends the connection and joins the threads once every request
//! they took has been answered.

mod abi;
mod attr;
mod devfuse;
mod handler;
mod helper_cpu;
mod init;
mod io;
mod limits;
mod mount;
mod reader_gate;
pub(super) mod reply;
mod request;
mod uring;
mod uring_payload;
mod uring_setup;
mod uring_wake;

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use block::{Disk, ExclusiveImage};
use ch_util::kv::{parse_on_off, KvError, KvList};

use super::running::{Export, ExportError};
use attr::ExportState;
use devfuse::DevQueue;
use mount::{FuseMount, MountOptions};
use reader_gate::ReaderGate;

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
#[derive(Clone, Debug)]
pub struct FuseConfig {
    pub mountpoint: PathBuf,
    pub writable: bool,
    pub growable: bool,
    pub allow_other: AllowOther,
    pub io_uring: bool,
    pub num_queues: u16,
    /// The longest a queue thread spins for an event before it sleeps
    /// ([`ch_util::adaptive_poll`]); zero: never.
    pub poll_max: Duration,
}

/// Most FUSE queues (threads) per export.
pub const MAX_QUEUES: u16 = 64;

/// Default of `poll_max_us`: off. Measured on a 2-CPU machine
/// (docs/storage-daemon.md, "Polling"), spinning cost more CPU than the
/// wake-ups it saved, loaded or quiet.
pub const DEFAULT_POLL_MAX_US: u64 = 0;
/// Largest `poll_max_us` accepted.
const MAX_POLL_MAX_US: u64 = 1000;

impl FuseConfig {
    pub fn from_kv(kv: &mut KvList) -> Result<Self, KvError> {
        let mountpoint = kv.take_required("mountpoint")?;
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
            poll_max: Duration::from_micros(
                kv.take_parsed("poll_max_us", |s| match s.parse::<u64>() {
                    Ok(n) if n <= MAX_POLL_MAX_US => Ok(n),
                    _ => Err(format!("expected microseconds from 0 to {MAX_POLL_MAX_US}")),
                })?
                .unwrap_or(DEFAULT_POLL_MAX_US),
            ),
        })
    }
}

/// A running FUSE export.
pub struct FuseExport {
    mount: FuseMount,
    io_uring: bool,
    threads: Vec<JoinHandle<std::io::Result<()>>>,
}

fn fuse_error(config: &FuseConfig, reason: impl std::fmt::Display) -> ExportError {
    ExportError::Fuse {
        mountpoint: config.mountpoint.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Mounts the export of `image` (which the daemon owns) and starts its
/// queue threads.
pub fn start(image: &ExclusiveImage, config: FuseConfig) -> Result<Box<dyn Export>, ExportError> {
    let disk = image.disk();
    if config.writable && disk.readonly() {
        return Err(fuse_error(
            &config,
            "writable=on needs an image opened read-write (the image is read-only)",
        ));
    }
    mount::check_mountpoint(&config.mountpoint).map_err(|e| fuse_error(&config, e))?;
    let session = mount::open_device().map_err(|e| fuse_error(&config, e))?;
    let allow_other = config.allow_other != AllowOther::Off;
    let mount = mount::mount(
        &session,
        &config.mountpoint,
        &MountOptions {
            writable: config.writable,
            allow_other,
        },
    )
    .map_err(|e| fuse_error(&config, e))?;
    let state = Arc::new(ExportState::new(
        image,
        config.writable,
        config.growable,
        allow_other,
    ));
    match start_queues(disk, &config, session, &state) {
        Ok(threads) => Ok(Box::new(FuseExport {
            mount,
            io_uring: config.io_uring,
            threads,
        })),
        Err(e) => {
            let _ = mount.unmount();
            mount.abort_connection();
            Err(e)
        }
    }
}

/// Answers INIT, then starts the /dev/fuse threads and (io_uring=on) the
/// ring threads.
fn start_queues(
    disk: &Disk,
    config: &FuseConfig,
    session: std::fs::File,
    state: &Arc<ExportState>,
) -> Result<Vec<JoinHandle<std::io::Result<()>>>, ExportError> {
    let negotiated =
        init::negotiate(&session, config.io_uring).map_err(|e| fuse_error(config, e))?;
    let mut devices = Vec::with_capacity(usize::from(config.num_queues));
    for _ in 1..config.num_queues {
        devices.push(mount::clone_device(&session).map_err(|e| fuse_error(config, e))?);
    }
    let rings = if negotiated.io_uring {
        uring::setup_rings(disk, &session, state, config.poll_max)
            .map_err(|e| fuse_error(config, e))?
    } else {
        Vec::new()
    };
    devices.insert(0, session);
    let gate = Arc::new(
        ReaderGate::new(devices.len() - 1)
            .map_err(|e| fuse_error(config, format!("/dev/fuse queue helpers: {e}")))?,
    );
    let mut threads = Vec::new();
    for (i, dev) in devices.into_iter().enumerate() {
        let helper = i.checked_sub(1);
        let queue = DevQueue::new(
            dev,
            disk.queue()?,
            state.clone(),
            config.poll_max,
            gate.clone(),
            helper,
        )
        .map_err(|e| fuse_error(config, format!("/dev/fuse queue {i}: {e}")))?;
        threads.push(spawn(format!("fuse-q{i}"), move || queue.run())?);
    }
    let (registered_tx, registered_rx) = std::sync::mpsc::channel();
    let ring_count = rings.len();
    for ring in rings {
        let name = format!("fuse-ring{}", ring.index());
        let tx = registered_tx.clone();
        threads.push(spawn(name, move || ring.run(tx))?);
    }
    for _ in 0..ring_count {
        let outcome = registered_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| fuse_error(config, format!("ring registration: {e}")))
            .and_then(|r| r.map_err(|e| fuse_error(config, e)));
        if let Err(e) = outcome {
            // The threads end on their own once the caller unmounts and
            // ends the connection; their handles are not joined.
            drop(threads);
            return Err(e);
        }
    }
    Ok(threads)
}

fn spawn(
    name: String,
    f: impl FnOnce() -> std::io::Result<()> + Send + 'static,
) -> Result<JoinHandle<std::io::Result<()>>, ExportError> {
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|source| ExportError::Io {
            what: format!("cannot start thread {name}"),
            source,
        })
}

impl Export for FuseExport {
    fn describe(&self) -> String {
        format!(
            "fuse export on {} ({} queue threads, {})",
            self.mount.mountpoint().display(),
            self.threads.len(),
            if self.io_uring {
                "FUSE-over-io_uring"
            } else {
                "/dev/fuse"
            }
        )
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        let unmounted = self.mount.unmount();
        // After a lazy unmount the file may still be open: end the
        // connection so the threads see it gone once their I/O is done.
        self.mount.abort_connection();
        let mut first_error = unmounted.map_err(|e| ExportError::Fuse {
            mountpoint: self.mount.mountpoint().display().to_string(),
            reason: e.to_string(),
        });
        for t in self.threads {
            let result = match t.join() {
                Ok(r) => r,
                Err(_) => Err(std::io::Error::other("a queue thread panicked")),
            };
            if let Err(e) = result {
                log::error!("fuse queue: {e}");
                if first_error.is_ok() {
                    first_error = Err(ExportError::Io {
                        what: "fuse queue thread".into(),
                        source: e,
                    });
                }
            }
        }
        first_error
    }
}
