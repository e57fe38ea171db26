//! The VM's lifecycle: build it from a [`VmConfig`], start the API server
//! if asked (`--api-socket`), run the vCPUs, hand the main thread to the
//! control loop ([`crate::control`]) until the end (guest reset or
//! power-off, SIGTERM/SIGINT, `vmm.shutdown`, or a fatal error), then
//! stop the vCPUs and shut the devices down so every disk is drained,
//! flushed and closed.
//!
//! Enters as a validated config; leaves as an [`ExitReason`] that `main`
//! turns into the process exit code, or an error (also when the VM ended
//! as asked but a disk failed its last flush or close: the exit status
//! must tell a supervisor so).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hypervisor::{Vcpu, Vm};
use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::Killable;

use crate::api::socket::SocketError;
use crate::api::{ApiReceiver, ApiServer};
use crate::boot::{self, BootEntry, BootError};
use crate::config::ApiSocketConfig;
use crate::config::VmConfig;
use crate::control::Control;
use crate::device_manager::{DeviceError, DeviceManager, OpenedDisk};
use crate::memory::{create_guest_memory, MemoryError};
use crate::seccomp::{self, SeccompError, ThreadKind};
use crate::vcpu::{kick_signal, run_vcpu, VcpuContext, VcpuHandle};
use crate::vcpu_pause::PauseGate;

/// Why the VM ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest asked for a reset (i8042, triple fault, PSCI-like event);
    /// this VMM exits instead of rebooting.
    Reset,
    PowerOff,
    /// SIGTERM or SIGINT.
    Signal(i32),
    /// `vmm.shutdown` through the API.
    ApiShutdown,
    /// Something we cannot continue from.
    Fatal(String),
}

/// First reason wins; the control loop (`crate::control`) waits on the
/// eventfd.
pub struct ExitSignal {
    reason: Mutex<Option<ExitReason>>,
    evt: EventFd,
}

impl ExitSignal {
    pub fn new() -> std::io::Result<Self> {
        Ok(ExitSignal {
            reason: Mutex::new(None),
            evt: EventFd::new(0)?,
        })
    }

    pub fn request(&self, reason: ExitReason) {
        let mut r = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason);
        }
        if let Err(e) = self.evt.write(1) {
            log::error!("cannot signal VM exit: {e}");
        }
    }

    /// The reason requested so far, if any.
    pub fn peek(&self) -> Option<ExitReason> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }
}

#[derive(Debug, Error)]
pub enum VmError {
    #[error("cannot create the VM")]
    CreateVm(#[source] hypervisor::HypervisorError),
    #[error("cannot set up guest memory")]
    Memory(#[source] MemoryError),
    #[error("cannot load the guest")]
    Boot(#[source] BootError),
    #[error("cannot set up devices")]
    Devices(#[source] DeviceError),
    #[error("cannot create vCPU")]
    CreateVcpu(#[source] hypervisor::HypervisorError),
    #[error("cannot start vCPU thread")]
    SpawnVcpu(#[source] std::io::Error),
    #[error("cannot create exit eventfd")]
    ExitEventFd(#[source] std::io::Error),
    #[error("cannot install seccomp filter")]
    Seccomp(#[source] SeccompError),
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    #[error("cannot set up the API socket")]
    ApiSocket(#[source] SocketError),
    #[error("cannot start the API server")]
    ApiServer(#[source] std::io::Error),
    #[error("the control loop failed")]
    Control(#[source] std::io::Error),
    /// The VM ended as asked, but a disk's last flush or close failed
    /// (its data may not all be on stable storage).
    #[error("the VM ended ({reason:?}), but closing its disks failed: {failures}")]
    CloseDisks {
        reason: ExitReason,
        failures: String,
    },
    #[error("cannot install the SIGSYS handler")]
    Sigsys(#[source] std::io::Error),
    #[error("cannot start the NBD connector thread")]
    NbdConnector(#[source] std::io::Error),
}

/// What the process needs before it opens a disk or installs a filter:
/// glibc's arena limit fixed, the SIGSYS report installed, and the NBD
/// connector thread started under its own filter (every NBD connection
/// is opened there, see [`crate::seccomp`]).
pub fn prepare_process(mode: crate::config::SeccompMode) -> Result<(), VmError> {
    seccomp::fix_malloc_arena_limit();
    seccomp::sigsys::install().map_err(VmError::Sigsys)?;
    let programs = seccomp::filters(ThreadKind::Nbd, mode).map_err(VmError::Seccomp)?;
    block::engines::nbd::start_connector(move || {
        seccomp::apply_programs(&programs).map_err(|e| ch_log::error_chain(&e))
    })
    .map_err(VmError::NbdConnector)
}

/// Opens the API socket and starts its threads (before the VM exists, so
/// a socket that cannot be made fails fast).
fn start_api(config: &VmConfig) -> Result<Option<(ApiServer, ApiReceiver<Control>)>, VmError> {
    let Some(cfg) = &config.api_socket else {
        return Ok(None);
    };
    let listener = crate::api::socket::listen(cfg).map_err(VmError::ApiSocket)?;
    let (receiver, sender) = crate::api::channel().map_err(VmError::ApiServer)?;
    let filters = seccomp::filters(ThreadKind::Api, config.seccomp).map_err(VmError::Seccomp)?;
    let path = match cfg {
        ApiSocketConfig::Path(p) => Some(p.clone()),
        ApiSocketConfig::Fd(_) => None,
    };
    let table = Arc::new(crate::endpoints::table());
    let server =
        ApiServer::start(listener, table, sender, filters, path).map_err(VmError::ApiServer)?;
    Ok(Some((server, receiver)))
}

/// Boots the VM described by `config` with the already opened `disks` and
/// runs it to the end.
pub fn run(config: &VmConfig, disks: Vec<OpenedDisk>) -> Result<ExitReason, VmError> {
    let exit = Arc::new(ExitSignal::new().map_err(VmError::ExitEventFd)?);
    crate::signals::install(exit.eventfd()).map_err(VmError::Signals)?;
    let (server, api) = match start_api(config)? {
        Some((s, r)) => (Some(s), Some(r)),
        None => (None, None),
    };
    let result = run_vm(config, disks, &exit, api);
    if let Some(s) = server {
        s.stop();
    }
    result
}

fn run_vm(
    config: &VmConfig,
    disks: Vec<OpenedDisk>,
    exit: &Arc<ExitSignal>,
    api: Option<ApiReceiver<Control>>,
) -> Result<ExitReason, VmError> {
    let vm = Vm::new().map_err(VmError::CreateVm)?;
    let mem =
        create_guest_memory(&vm, config.memory, config.shared_memory).map_err(VmError::Memory)?;
    let entry = boot::load_kernel(
        &mem,
        &config.kernel,
        config.initramfs.as_deref(),
        &config.cmdline,
        config.memory,
        config.cpus,
    )
    .map_err(VmError::Boot)?;
    let devices =
        DeviceManager::new(&vm, &mem, config, disks, exit.clone()).map_err(VmError::Devices)?;

    let gate = Arc::new(PauseGate::default());
    let vcpus = create_vcpus(&vm, config.cpus, &config.cpu_model, entry)?;
    let handles = match start_vcpus(vcpus, &devices, exit, config.seccomp, &gate) {
        Ok(h) => h,
        Err(e) => {
            devices.shutdown();
            return Err(e);
        }
    };
    if let Err(e) = seccomp::apply(ThreadKind::Main, config.seccomp) {
        stop_vcpus(handles, &gate);
        devices.shutdown();
        return Err(VmError::Seccomp(e));
    }

    let mut control = match Control::new(config.clone(), devices, handles, gate, exit.clone(), api)
    {
        Ok(c) => c,
        Err(e) => {
            return Err(VmError::Control(e));
        }
    };
    let result = control.run().map_err(VmError::Control);
    match &result {
        Ok(reason) => log::info!("VM exit: {reason:?}"),
        Err(e) => log::error!("VM exit: {}", ch_log::error_chain(e)),
    }
    control.stop_vm();
    let result = match (result, control.close_failures()) {
        (Ok(reason), failures)
            if !failures.is_empty() && !matches!(reason, ExitReason::Fatal(_)) =>
        {
            Err(VmError::CloseDisks {
                reason,
                failures: failures.join("; "),
            })
        }
        (result, _) => result,
    };
    // Devices hold the VM (MSI routes) and guest memory; the VM must go
    // before the memory its slots point at (see `Vm::map_memory`).
    drop(control);
    drop(vm);
    drop(mem);
    result
}

/// Creates `count` vCPUs of `model`; the first gets the boot protocol's
/// entry state. Warns once if KVM shows features the model hides.
fn create_vcpus(
    vm: &Vm,
    count: u8,
    model: &hypervisor::CpuModel,
    entry: BootEntry,
) -> Result<Vec<Vcpu>, VmError> {
    let mut vcpus = Vec::with_capacity(usize::from(count));
    for id in 0..count {
        let (vcpu, still_visible) = vm
            .create_vcpu(id, count, model)
            .map_err(VmError::CreateVcpu)?;
        if id == 0 {
            if !still_visible.is_empty() {
                let list = still_visible.join(",");
                log::warn!(
                    "this host's KVM shows the guest CPU features the CPU model hides \
                     (it ignored them in KVM_SET_CPUID2): {list}; a Linux guest can \
                     be told not to use them with clearcpuid={list}"
                );
            }
            match entry {
                BootEntry::Pvh { entry, start_info } => {
                    vcpu.enter_protected_mode(entry, start_info)
                }
                BootEntry::Linux64 { entry, boot_params } => vcpu.enter_long_mode(
                    entry,
                    boot_params,
                    crate::layout::PML4_START,
                    crate::layout::GDT_START,
                    (boot::bzimage::GDT.len() * 8 - 1) as u16,
                ),
            }
            .map_err(VmError::CreateVcpu)?;
        }
        vcpus.push(vcpu);
    }
    Ok(vcpus)
}

/// Starts one thread per vCPU, each under the vCPU seccomp filter. If one
/// cannot start, the ones already running are stopped.
fn start_vcpus(
    vcpus: Vec<Vcpu>,
    devices: &DeviceManager,
    exit: &Arc<ExitSignal>,
    mode: crate::config::SeccompMode,
    gate: &Arc<PauseGate>,
) -> Result<Vec<VcpuHandle>, VmError> {
    let filters = seccomp::filters(ThreadKind::Vcpu, mode).map_err(VmError::Seccomp)?;
    let mut handles = Vec::with_capacity(vcpus.len());
    for vcpu in vcpus {
        let stop = Arc::new(AtomicBool::new(false));
        let ctx = VcpuContext {
            pio: devices.pio.clone(),
            mmio: devices.mmio.clone(),
            exit: exit.clone(),
            stop: stop.clone(),
            gate: gate.clone(),
        };
        let filters = filters.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("vcpu{}", vcpu.id()))
            .spawn(move || {
                if let Err(e) = seccomp::apply_programs(&filters) {
                    ctx.exit
                        .request(ExitReason::Fatal(format!("vCPU seccomp: {e}")));
                    return;
                }
                run_vcpu(vcpu, ctx)
            });
        match spawned {
            Ok(thread) => handles.push(VcpuHandle { thread, stop }),
            Err(e) => {
                stop_vcpus(handles, gate);
                return Err(VmError::SpawnVcpu(e));
            }
        }
    }
    Ok(handles)
}

/// Sets every stop flag and kicks the threads out of `KVM_RUN` (or off
/// the pause gate) until they have all returned.
pub(crate) fn stop_vcpus(handles: Vec<VcpuHandle>, gate: &PauseGate) {
    for h in &handles {
        h.stop.store(true, Ordering::Release);
    }
    gate.wake_for_stop();
    for h in handles {
        // A kick that lands between the flag check and KVM_RUN is lost,
        // so repeat until the thread is gone.
        while !h.thread.is_finished() {
            if let Err(e) = h.thread.kill(kick_signal()) {
                log::warn!("cannot kick vCPU thread: {e}");
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.thread.join().is_err() {
            log::error!("a vCPU thread panicked");
        }
    }
}
