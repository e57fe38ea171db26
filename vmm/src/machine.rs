//! One boot of the VM: the KVM VM, guest RAM with the kernel loaded, the
//! devices and the running vCPU threads. `vm.boot` builds one from the
//! disks it just opened; a reboot (`vm.reboot`, a guest reset) takes the
//! devices out of the old one ([`Machine::carry_out`]: vCPUs stopped,
//! every disk drained and reset, its image left open and locked, its
//! counters kept) and builds a new one around them, the kernel loaded
//! again, as Cloud Hypervisor rebuilds its VM from the same config.
//!
//! [`build`] runs on the `vm-builder` thread ([`crate::vm_builder`]);
//! everything else here runs on the control loop. Enters as a
//! [`BootConfig`] and the devices to start with; leaves as a running
//! [`Machine`], which the control loop stops, pauses and tears down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hypervisor::{Vcpu, Vm};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::Killable;

use crate::boot::{self, entry::BootEntry};
use crate::config::{BootConfig, SeccompMode};
use crate::device_manager::{Carried, DeviceManager, Devices};
use crate::exit::ExitSignal;
use crate::memory::create_guest_memory;
use crate::seccomp::{self, ThreadKind};
use crate::vcpu::{run_vcpu, VcpuContext};
use crate::vcpu_pause::PauseGate;
use crate::vcpu_thread::{kick_signal, VcpuHandle};
use crate::vm_error::VmError;

/// What [`build`] needs besides the config.
pub struct Wiring {
    /// Where guest resets, power-off and fatal vCPU errors go.
    pub exit: Arc<ExitSignal>,
    /// Signalled when the guest ejects a hot-plugged slot (the control
    /// loop waits on it; the same one serves every boot).
    pub eject: EventFd,
    pub seccomp: SeccompMode,
}

/// A running VM.
pub struct Machine {
    pub devices: DeviceManager,
    pub vcpus: Vec<VcpuHandle>,
    pub gate: Arc<PauseGate>,
    vm: Arc<Vm>,
    mem: Arc<GuestMemoryMmap>,
}

/// Creates the VM, loads the guest, builds the devices and starts the
/// vCPUs. On failure the devices it was given are shut down (images
/// flushed, closed and unlocked) before the error returns.
pub fn build(boot: &BootConfig, devices: Devices, wiring: Wiring) -> Result<Machine, VmError> {
    let mut devices = Some(devices);
    let result = build_with(boot, &mut devices, wiring);
    if result.is_err() {
        if let Some(d) = devices.take() {
            close_unused(d);
        }
    }
    result
}

fn build_with(
    boot: &BootConfig,
    devices: &mut Option<Devices>,
    wiring: Wiring,
) -> Result<Machine, VmError> {
    let vm = Vm::new().map_err(VmError::CreateVm)?;
    let mem = create_guest_memory(&vm, boot.memory, boot.shared_memory).map_err(VmError::Memory)?;
    let entry = boot::load_kernel(
        &mem,
        &boot.kernel,
        boot.initramfs.as_deref(),
        &boot.cmdline,
        boot.memory,
        boot.cpus,
    )
    .map_err(VmError::LoadGuest)?;
    let vcpus = create_vcpus(&vm, boot.cpus, &boot.cpu_model, entry)?;
    let start = devices.take().expect("given once");
    let devices = DeviceManager::new(
        &vm,
        &mem,
        boot,
        start,
        wiring.exit.clone(),
        wiring.eject,
        wiring.seccomp,
    )
    .map_err(VmError::Devices)?;
    let gate = Arc::new(PauseGate::default());
    let handles = match start_vcpus(vcpus, &devices, &wiring.exit, wiring.seccomp, &gate) {
        Ok(h) => h,
        Err(e) => {
            devices.shutdown();
            return Err(e);
        }
    };
    Ok(Machine {
        devices,
        vcpus: handles,
        gate,
        vm,
        mem,
    })
}

/// Closes the images of devices a failed build did not use.
fn close_unused(devices: Devices) {
    match devices {
        Devices::Fresh(disks) => {
            for d in disks {
                if let Err(e) = d.image.close() {
                    log::error!(
                        "disk {}: closing after a failed boot: {e}",
                        d.config.options.path.display()
                    );
                }
            }
        }
        Devices::Carried(c) => c.shut_down(),
    }
}

impl Machine {
    /// Stops the vCPUs (a paused VM's too) and waits for their threads.
    pub fn stop_vcpus(&mut self) {
        stop_vcpus(std::mem::take(&mut self.vcpus), &self.gate);
    }

    /// For a reboot: stops the vCPUs, takes every device off the bus
    /// (drained and reset, images open), and drops the rest of the VM.
    pub fn carry_out(mut self) -> Carried {
        self.stop_vcpus();
        let Machine {
            devices, vm, mem, ..
        } = self;
        let carried = devices.carry_out();
        drop(vm);
        drop(mem);
        carried
    }

    /// Stops the vCPUs and shuts every device on the bus down (the
    /// caller has taken off the disks it closes itself), then drops the
    /// VM.
    pub fn shut_down(mut self) {
        self.stop_vcpus();
        self.devices.shutdown();
        self.tear_down();
    }

    /// Devices hold the VM (MSI routes) and guest memory; the VM must go
    /// before the memory its slots point at (see `Vm::map_memory`).
    fn tear_down(self) {
        let Machine {
            devices, vm, mem, ..
        } = self;
        drop(devices);
        drop(vm);
        drop(mem);
    }
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
    mode: SeccompMode,
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
                        .request(crate::exit::ExitReason::Fatal(format!("vCPU seccomp: {e}")));
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
