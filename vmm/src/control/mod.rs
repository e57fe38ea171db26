//! The VMM's control loop: the main thread waits here for whatever can
//! change the VM, and does it, one thing at a time.
//!
//! Sources (one epoll): the exit eventfd (a guest reset, which reboots
//! the VM; a guest power-off, SIGTERM/SIGINT or a fatal vCPU error,
//! which end the VMM), API requests ([`crate::api`]: each arrives as a
//! job, made from its row of the endpoint table (`crate::endpoints`),
//! with a reply channel), the PCI hotplug eject eventfd (the guest
//! released a slot), and the eventfd a block job's thread writes when
//! it ends. Every request is answered from here by its
//! handler, a method of [`Control`]: the VM's lifecycle ([`lifecycle`]:
//! create, boot, reboot, shutdown, delete, the power button), its state
//! ([`vm_ops`]: pause, resume, counters), disk operations ([`disk_ops`]:
//! resize, snapshot, info; [`disk_snapshot`]: external snapshots of
//! a group of disks; [`disk_bitmaps`]: dirty bitmaps and their
//! transactions; [`disk_backup`]: point-in-time NBD exports; all on
//! disks paused together by [`disk_group`]; [`disk_jobs`]: block jobs,
//! the mirror, held in [`job_registry`] and ended when the VM stops;
//! [`disk_stream`]: stream and commit, whose end [`chain_switch`] runs
//! here when a job's thread says it is done),
//! hotplug ([`hotplug`]: add, remove). A removal waits for the guest's
//! eject without blocking the loop: it is
//! parked in `removals` and answered when the eject arrives or its
//! deadline passes.
//!
//! One request at a time also orders a reboot after a disk operation in
//! progress (a resize, a snapshot): the reset waits until it is done.
//! Nothing here runs on the request path: a disk operation goes to the
//! disk's queue workers as a pause (they drain and park), runs on this
//! thread while nothing is in flight, and resumes them. Every change
//! worth reporting is one [`crate::events::emit`] call in its handler.

mod backup_record;
mod chain_switch;
mod disk_backup;
mod disk_bitmaps;
mod disk_group;
mod disk_jobs;
mod disk_ops;
mod disk_snapshot;
mod disk_stream;
mod hotplug;
mod info;
mod job_registry;
mod lifecycle;
mod status;
mod vm_ops;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::api::endpoint::Responder;
use crate::api::{ApiReceiver, ApiResponse};
use crate::config::{BootConfig, SeccompMode, VmConfig};
use crate::exit::{ExitReason, ExitSignal};
use crate::machine::Machine;
use crate::terminal::RawTerminal;
use crate::vm_builder::VmBuilder;

const EXIT: u64 = 0;
const API: u64 = 1;
const EJECT: u64 = 2;
const JOB: u64 = 3;

/// What `vm.info` calls the VM's state (upstream's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    /// A config, no VM: after `vm.create`, or `vm.shutdown`.
    Created,
    Running,
    Paused,
}

impl VmState {
    pub fn name(self) -> &'static str {
        match self {
            VmState::Created => "Created",
            VmState::Running => "Running",
            VmState::Paused => "Paused",
        }
    }
}

/// A `vm.remove-device` waiting for the guest to eject the slot.
struct PendingRemoval {
    id: String,
    slot: usize,
    deadline: Instant,
    reply: Responder,
}

/// The booted VM.
pub struct RunningVm {
    /// The checked config it was built from (a reboot builds from it
    /// again).
    pub boot: BootConfig,
    pub machine: Machine,
    pub paused: bool,
    /// The terminal in raw mode while the guest owns it (serial tty).
    _terminal: Option<RawTerminal>,
}

/// Everything the loop acts on.
pub struct Control {
    seccomp: SeccompMode,
    builder: VmBuilder,
    pub exit: Arc<ExitSignal>,
    pub api: Option<ApiReceiver<Control>>,
    /// `vm.create`'s (or the command line's) config; `None`: no VM.
    config: Option<VmConfig>,
    /// The booted VM, if any.
    vm: Option<RunningVm>,
    removals: Vec<PendingRemoval>,
    /// Every boot's hotplug registers signal this one.
    eject: EventFd,
    /// Why disks failed to close when the VM stopped.
    close_failures: Vec<String>,
    /// `vm.counters`' answer once the disks are off the bus.
    final_counters: Option<serde_json::Value>,
    /// Point-in-time backups being served ([`disk_backup`]).
    backups: Vec<backup_record::Backup>,
    /// Block jobs (mirrors), one at a time per disk.
    jobs: job_registry::JobRegistry,
    /// Written by a job's thread when it ends: a stream or commit whose
    /// copy is done is finished here ([`chain_switch`]).
    job_ended: Arc<EventFd>,
}

impl Control {
    pub fn new(
        seccomp: SeccompMode,
        builder: VmBuilder,
        exit: Arc<ExitSignal>,
        api: Option<ApiReceiver<Control>>,
    ) -> std::io::Result<Self> {
        Ok(Control {
            seccomp,
            builder,
            exit,
            api,
            config: None,
            vm: None,
            removals: Vec::new(),
            eject: EventFd::new(libc::EFD_NONBLOCK)?,
            close_failures: Vec::new(),
            final_counters: None,
            backups: Vec::new(),
            jobs: Default::default(),
            job_ended: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
        })
    }

    fn state(&self) -> VmState {
        match &self.vm {
            None => VmState::Created,
            Some(v) if v.paused => VmState::Paused,
            Some(_) => VmState::Running,
        }
    }

    /// The running (or paused) VM, or the answer upstream gives when
    /// there is none: 404 without a config, else 500.
    fn machine(&self, what: &str) -> Result<&Machine, ApiResponse> {
        match (&self.vm, &self.config) {
            (Some(v), _) => Ok(&v.machine),
            (None, None) => Err(ApiResponse::error(404, &[what, "the VM is not created"])),
            (None, Some(_)) => Err(ApiResponse::error(500, &[what, "the VM is not running"])),
        }
    }

    /// As [`Control::machine`], 500 also without a config (pause,
    /// resume, shutdown, power-button, counters: upstream's answers).
    fn booted(&self, what: &str) -> Result<&Machine, ApiResponse> {
        self.vm
            .as_ref()
            .map(|v| &v.machine)
            .ok_or_else(|| ApiResponse::error(500, &[what, "the VM is not running"]))
    }

    /// Runs until the VMM ends: a guest power-off, a signal,
    /// `vmm.shutdown` or a fatal error. A guest reset reboots the VM.
    pub fn run(&mut self) -> std::io::Result<ExitReason> {
        let epoll = Epoll::new()?;
        let mut sources = vec![
            (self.exit.eventfd().as_raw_fd(), EXIT),
            (self.eject.as_raw_fd(), EJECT),
            (self.job_ended.as_raw_fd(), JOB),
        ];
        if let Some(api) = &self.api {
            sources.push((api.wake.as_raw_fd(), API));
        }
        for (fd, token) in sources {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )?;
        }
        let mut events = [EpollEvent::default(); 4];
        loop {
            if let Some(reason) = self.exit_requested() {
                match reason {
                    ExitReason::Reset => {
                        if let Err(fatal) = self.guest_reset() {
                            return Ok(fatal);
                        }
                    }
                    other => return Ok(other),
                }
            }
            let timeout = self
                .removals
                .iter()
                .map(|r| r.deadline.saturating_duration_since(Instant::now()))
                .min()
                .map_or(-1, |d| i32::try_from(d.as_millis() + 1).unwrap_or(i32::MAX));
            let n = match epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                match ev.data() {
                    // Read by `exit_requested` (`ExitSignal::take`).
                    EXIT => {}
                    API => self.serve_api(),
                    EJECT => self.on_eject(),
                    JOB => {
                        let _ = self.job_ended.read();
                        self.finish_chain_jobs();
                    }
                    _ => {}
                }
            }
            self.expire_removals();
        }
    }

    /// An exit asked for, taken (a signal is one too). The eventfd is
    /// drained before the signal flag is read, so a signal that comes
    /// later still wakes the loop; a signal wins over a reset (a guest
    /// that resets at once must not keep the VMM from ending).
    fn exit_requested(&self) -> Option<ExitReason> {
        let taken = self.exit.take();
        match (taken, crate::signals::take_pending()) {
            (None | Some(ExitReason::Reset), Some(sig)) => Some(ExitReason::Signal(sig)),
            (taken, _) => taken,
        }
    }

    fn serve_api(&mut self) {
        let Some(api) = &self.api else { return };
        let _ = api.wake.read();
        let messages: Vec<_> = api.messages.try_iter().collect();
        for m in messages {
            log::debug!("control: {}", m.name);
            (m.job)(self, Responder::new(m.reply));
        }
    }
}
