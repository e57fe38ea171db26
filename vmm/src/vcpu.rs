//! vCPU threads: each runs `KVM_RUN` in a loop and dispatches port and
//! MMIO exits to the device buses; events that end the VM (reset, power
//! off, an exit we cannot handle) leave through the [`ExitSignal`].
//!
//! A `KVM_EXIT_INTERNAL_ERROR` goes to the hypervisor crate, which
//! completes an INT3 or FWAIT that KVM's instruction emulator gave up on
//! (as the hardware would) or returns KVM's report: the VM then stops with
//! it, and `-v` logs the vCPU's registers.
//!
//! The main thread stops a vCPU by setting its stop flag and sending it
//! the kick signal ([`crate::vcpu_thread`]), which interrupts `KVM_RUN`
//! with EINTR.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hypervisor::{InternalErrorOutcome, SystemEvent, Vcpu, VcpuExit};

use crate::devices::bus::Bus;
use crate::exit::{ExitReason, ExitSignal};
use crate::vcpu_pause::PauseGate;

/// What a vCPU thread shares with the rest of the VMM.
pub struct VcpuContext {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub exit: Arc<ExitSignal>,
    pub stop: Arc<AtomicBool>,
    /// Closed while the VM is paused (`vm.pause`).
    pub gate: Arc<PauseGate>,
}

/// Runs until told to stop or the VM ends.
pub fn run_vcpu(mut vcpu: Vcpu, ctx: VcpuContext) {
    let id = vcpu.id();
    loop {
        if ctx.stop.load(Ordering::Acquire) {
            return;
        }
        ctx.gate.pass(&ctx.stop);
        if ctx.stop.load(Ordering::Acquire) {
            return;
        }
        let exit = match vcpu.run() {
            Ok(e) => e,
            Err(e) => {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                ctx.exit.request(ExitReason::Fatal(format!("{e}{cause}")));
                return;
            }
        };
        let end = match exit {
            VcpuExit::IoIn(port, data) => {
                ctx.pio.read(u64::from(port), data);
                None
            }
            VcpuExit::IoOut(port, data) => {
                ctx.pio.write(u64::from(port), data);
                None
            }
            VcpuExit::MmioRead(addr, data) => {
                ctx.mmio.read(addr, data);
                None
            }
            VcpuExit::MmioWrite(addr, data) => {
                ctx.mmio.write(addr, data);
                None
            }
            VcpuExit::Interrupted => None,
            VcpuExit::InternalError => internal_error(&mut vcpu),
            VcpuExit::Hlt => {
                log::info!("vCPU {id} halted");
                Some(ExitReason::PowerOff)
            }
            VcpuExit::Shutdown => {
                log::info!("vCPU {id}: triple fault, treating as a reset");
                Some(ExitReason::Reset)
            }
            VcpuExit::SystemEvent(SystemEvent::Reset) => Some(ExitReason::Reset),
            VcpuExit::SystemEvent(SystemEvent::Shutdown) => Some(ExitReason::PowerOff),
            VcpuExit::SystemEvent(ev) => Some(ExitReason::Fatal(format!(
                "vCPU {id}: unexpected system event {ev:?}"
            ))),
            VcpuExit::Unhandled(what) => Some(ExitReason::Fatal(format!(
                "vCPU {id}: unhandled exit: {what}"
            ))),
        };
        if let Some(reason) = end {
            ctx.exit.request(reason);
            return;
        }
    }
}

/// Completes the instruction KVM could not, or says why the VM must stop.
fn internal_error(vcpu: &mut Vcpu) -> Option<ExitReason> {
    let id = vcpu.id();
    match vcpu.handle_internal_error() {
        Ok(InternalErrorOutcome::Completed(done)) => {
            log::debug!("vCPU {id}: {done}");
            None
        }
        Ok(InternalErrorOutcome::Fatal(report)) => {
            log::info!("vCPU {id} registers:\n{}", vcpu.register_dump());
            Some(ExitReason::Fatal(format!("vCPU {id}: {report}")))
        }
        Err(e) => Some(ExitReason::Fatal(format!(
            "vCPU {id}: cannot complete an instruction KVM failed to emulate: {e}{}",
            std::error::Error::source(&e)
                .map(|c| format!(": {c}"))
                .unwrap_or_default()
        ))),
    }
}
