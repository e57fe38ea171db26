//! The VMM's control loop: the main thread, once the guest runs, waits
//! here for whatever can change the VM, and does it, one thing at a time.
//!
//! Sources (one epoll): the exit eventfd (guest reset or power-off,
//! SIGTERM/SIGINT, a fatal vCPU error), API requests ([`crate::api`]:
//! each arrives as a job, made from its row of the endpoint table
//! (`crate::endpoints`), with a reply channel), and the PCI hotplug
//! eject eventfd (the guest released a slot). Every request is answered
//! from here by its handler, a method of [`Control`]: VM state changes
//! ([`vm_ops`]), disk operations ([`disk_ops`]: counters, resize,
//! snapshot, info), hotplug ([`hotplug`]: add, remove). A removal waits for the guest's eject
//! without blocking the loop: it is parked in `removals` and answered
//! when the eject arrives or its deadline passes.
//!
//! Nothing here runs on the request path: a disk operation goes to the
//! disk's queue workers as a pause (they drain and park), runs on this
//! thread while nothing is in flight, and resumes them.

mod disk_ops;
mod hotplug;
mod info;
mod status;
mod vm_ops;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::api::endpoint::Responder;
use crate::api::{ApiReceiver, ApiResponse};
use crate::config::VmConfig;
use crate::device_manager::DeviceManager;
use crate::vcpu::VcpuHandle;
use crate::vcpu_pause::PauseGate;
use crate::vm::{ExitReason, ExitSignal};

const EXIT: u64 = 0;
const API: u64 = 1;
const EJECT: u64 = 2;

/// What `vm.info` calls the VM's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    Running,
    Paused,
    /// `vm.shutdown`: vCPUs stopped, disks closed and off the bus; the
    /// VMM still answers.
    Shutdown,
}

impl VmState {
    pub fn name(self) -> &'static str {
        match self {
            VmState::Running => "Running",
            VmState::Paused => "Paused",
            VmState::Shutdown => "Shutdown",
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

/// Everything the loop acts on.
pub struct Control {
    pub config: VmConfig,
    pub devices: DeviceManager,
    pub vcpus: Vec<VcpuHandle>,
    pub gate: Arc<PauseGate>,
    pub exit: Arc<ExitSignal>,
    pub api: Option<ApiReceiver<Control>>,
    state: VmState,
    removals: Vec<PendingRemoval>,
    eject: EventFd,
    /// `vm.info`'s view of the disks taken off the bus by `vm.shutdown`.
    retired: Vec<crate::config::DiskConfig>,
    /// Why disks failed to close when the VM stopped.
    close_failures: Vec<String>,
    /// `vm.counters`' answer once the disks are off the bus.
    final_counters: Option<serde_json::Value>,
}

impl Control {
    pub fn new(
        config: VmConfig,
        devices: DeviceManager,
        vcpus: Vec<VcpuHandle>,
        gate: Arc<PauseGate>,
        exit: Arc<ExitSignal>,
        api: Option<ApiReceiver<Control>>,
    ) -> std::io::Result<Self> {
        let eject = devices
            .hotplug
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .eject_event()?;
        Ok(Control {
            config,
            devices,
            vcpus,
            gate,
            exit,
            api,
            state: VmState::Running,
            removals: Vec::new(),
            eject,
            retired: Vec::new(),
            close_failures: Vec::new(),
            final_counters: None,
        })
    }

    /// Runs until the VM (or, after `vm.shutdown`, the VMM) ends.
    pub fn run(&mut self) -> std::io::Result<ExitReason> {
        let epoll = Epoll::new()?;
        let mut sources = vec![
            (self.exit.eventfd().as_raw_fd(), EXIT),
            (self.eject.as_raw_fd(), EJECT),
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
                return Ok(reason);
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
                    EXIT => {
                        let _ = self.exit.eventfd().read();
                    }
                    API => self.serve_api(),
                    EJECT => self.on_eject(),
                    _ => {}
                }
            }
            self.expire_removals();
        }
    }

    /// An exit asked for (signals are turned into one here).
    fn exit_requested(&self) -> Option<ExitReason> {
        if let Some(sig) = crate::signals::take_pending() {
            self.exit.request(ExitReason::Signal(sig));
        }
        self.exit.peek()
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

    /// A request that needs a running (or paused) VM, in a shut one: 500,
    /// as Cloud Hypervisor answers it.
    fn refuse_when_shut(&self, what: &str) -> Option<ApiResponse> {
        (self.state == VmState::Shutdown)
            .then(|| ApiResponse::error(500, &[what, "the VM is not running"]))
    }
}
