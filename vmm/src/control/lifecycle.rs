//! The VM's lifecycle, as Cloud Hypervisor's API drives it: `vm.create`
//! stores a config (nothing is checked but its shape and the parts this
//! VMM lacks), `vm.boot` checks it, opens the disks and has the
//! `vm-builder` thread make the VM ([`crate::machine`]); `vm.shutdown`
//! stops it and closes every disk (the config stays: `vm.boot` again
//! works); `vm.delete` drops the config; `vm.reboot` and every guest
//! reset rebuild the VM around the same open disks; `vmm.shutdown` ends
//! the VMM. Each step is reported on the event monitor with upstream's
//! names (`vm` `booting`/`booted`, `rebooting`/`rebooted`, `shutdown`,
//! `deleted`; `vmm` `shutdown`).
//!
//! The answers when the VM is not in the state a request needs are
//! upstream's: `vm.boot` without a config 404, twice 500; `vm.create`
//! twice 500; `vm.reboot` without a VM 404; `vm.shutdown` without one
//! 500; `vm.delete` without a config 204.

use super::{status, Control, RunningVm};
use crate::api::ApiResponse;
use crate::config::{SerialMode, VmConfig};
use crate::device_manager::{open_disks, Devices};
use crate::events::emit;
use crate::exit::ExitReason;
use crate::machine::{build, Wiring};
use crate::terminal::RawTerminal;
use crate::vm_error::VmError;

impl Control {
    /// Stores the command line's config, as `vm.create` would.
    pub fn create(&mut self, config: VmConfig) {
        self.config = Some(config);
    }

    pub(crate) fn vm_create(&mut self, config: VmConfig) -> ApiResponse {
        if self.config.is_some() {
            return ApiResponse::error(500, &["vm.create", "the VM is already created"]);
        }
        if let Err(e) = config.refuse_unimplemented() {
            return ApiResponse::error(400, &["invalid VM configuration", &e.to_string()]);
        }
        self.config = Some(config);
        log::info!("VM created (vm.boot boots it)");
        ApiResponse::no_content()
    }

    fn wiring(&self) -> Result<Wiring, VmError> {
        Ok(Wiring {
            exit: self.exit.clone(),
            eject: self.eject.try_clone().map_err(VmError::ExitEventFd)?,
            seccomp: self.seccomp,
        })
    }

    /// Boots the created VM: checks its config, opens its disks, builds
    /// it on the `vm-builder` thread and starts its vCPUs.
    pub fn boot(&mut self) -> Result<(), VmError> {
        emit("vm", "booting", &[]);
        let wiring = self.wiring()?;
        let config = self.config.as_mut().ok_or(VmError::NotCreated)?;
        let boot = config.resolve().map_err(VmError::Config)?;
        let disks = open_disks(&boot.disks).map_err(VmError::OpenDisks)?;
        // The guest owns the terminal while it runs (restored on drop).
        let terminal = if boot.serial == SerialMode::Tty {
            RawTerminal::enter().unwrap_or_else(|e| {
                log::warn!("cannot put the terminal in raw mode: {e}");
                None
            })
        } else {
            None
        };
        let plan = boot.clone();
        let machine = self
            .builder
            .run(move || build(&plan, Devices::Fresh(disks), wiring))
            .ok_or(VmError::BuilderGone)??;
        self.vm = Some(RunningVm {
            boot,
            machine,
            paused: false,
            _terminal: terminal,
        });
        self.final_counters = None;
        self.record_disks();
        log::info!("VM booted");
        emit("vm", "booted", &[]);
        Ok(())
    }

    /// The disks on the bus, as the config lists them (with their ids
    /// and probed formats, as upstream writes them back).
    pub(super) fn record_disks(&mut self) {
        let disks = self.disk_configs();
        if let Some(c) = self.config.as_mut() {
            c.disks = (!disks.is_empty()).then_some(disks);
        }
    }

    pub(crate) fn vm_boot(&mut self) -> ApiResponse {
        if self.vm.is_some() {
            return ApiResponse::error(500, &["vm.boot", "the VM is already booted"]);
        }
        match self.boot() {
            Ok(()) => ApiResponse::no_content(),
            Err(e) => ApiResponse::from_error_in(status::of_vm(&e), Some("cannot boot the VM"), &e),
        }
    }

    /// Stops the vCPUs, finishes the removals still waiting, then takes
    /// every disk off the bus: drained, flushed, closed, its files closed
    /// and its locks released when this returns. Returns what failed to
    /// close (also kept in `close_failures`: the VMM's exit status
    /// reports it).
    pub(super) fn stop_vm(&mut self) -> Vec<String> {
        let Some(vm) = self.vm.as_mut() else {
            return Vec::new();
        };
        vm.machine.stop_vcpus();
        // No job may read a disk being closed.
        self.jobs.end_all();
        self.end_backups();
        self.finish_removals_now();
        self.record_disks();
        self.final_counters = Some(self.counters_now());
        let ids: Vec<String> = self
            .vm
            .iter()
            .flat_map(|v| v.machine.devices.disks.iter().map(|d| d.id.clone()))
            .collect();
        let mut failures = Vec::new();
        for id in ids {
            if let Some(Err(e)) = self.retire_disk(&id) {
                failures.push(format!("disk '{id}': {e}"));
            }
        }
        if let Some(vm) = self.vm.take() {
            // Whatever else is on the bus.
            vm.machine.shut_down();
        }
        if failures.is_empty() {
            log::info!("VM shut down: vCPUs stopped, disks closed");
        } else {
            log::error!(
                "VM shut down: vCPUs stopped; closing disks failed: {}",
                failures.join("; ")
            );
        }
        self.close_failures.extend(failures.iter().cloned());
        emit("vm", "shutdown", &[]);
        failures
    }

    pub(crate) fn vm_shutdown(&mut self) -> ApiResponse {
        if let Err(r) = self.booted("vm.shutdown") {
            return r;
        }
        let failures = self.stop_vm();
        log::info!("the VMM keeps serving the API until vmm.shutdown");
        closed_answer("the VM is shut down, but closing disks failed", failures)
    }

    pub(crate) fn vm_delete(&mut self) -> ApiResponse {
        if self.config.is_none() {
            return ApiResponse::no_content();
        }
        let failures = self.stop_vm();
        self.config = None;
        self.final_counters = None;
        log::info!("VM deleted");
        emit("vm", "deleted", &[]);
        closed_answer("the VM is deleted, but closing disks failed", failures)
    }

    pub(crate) fn vmm_shutdown(&mut self) -> ApiResponse {
        // The VM is stopped and its disks closed by `end` once the loop
        // returns; the answer goes out first (200 and no body, as
        // upstream answers).
        self.exit.request(ExitReason::ApiShutdown);
        ApiResponse::ok_empty()
    }

    /// The VMM is ending: the VM stops (disks closed), the config goes.
    pub fn end(&mut self) {
        self.stop_vm();
        if self.config.take().is_some() {
            emit("vm", "deleted", &[]);
        }
        emit("vmm", "shutdown", &[]);
    }

    /// Rebuilds the VM around its open disks: vCPUs stopped, every disk
    /// drained and reset, a new VM made from the same config, the kernel
    /// loaded again. If the new VM cannot be made, the disks are closed
    /// and the VM is left shut down.
    fn reboot(&mut self) -> Result<(), VmError> {
        let vm = self.vm.as_mut().ok_or(VmError::NotCreated)?;
        vm.machine.stop_vcpus();
        self.finish_removals_now();
        self.final_counters = Some(self.counters_now());
        let RunningVm {
            boot,
            machine,
            _terminal,
            ..
        } = self.vm.take().ok_or(VmError::NotCreated)?;
        let carried = machine.carry_out();
        // A guest that asked twice (Linux writes the ACPI reset register,
        // then the i8042 too) must not reset the new VM.
        if let Some(r) = self.exit.take() {
            if r == ExitReason::Reset {
                log::debug!("a second reset request from the old VM: ignored");
            } else {
                self.exit.request(r);
            }
        }
        let wiring = match self.wiring() {
            Ok(w) => w,
            Err(e) => {
                carried.shut_down();
                return Err(e);
            }
        };
        let plan = boot.clone();
        let built = self
            .builder
            .run(move || build(&plan, Devices::Carried(carried), wiring))
            .ok_or(VmError::BuilderGone)?;
        let machine = match built {
            Ok(m) => m,
            Err(e) => {
                log::error!(
                    "reboot failed: {}; the VM is shut down",
                    ch_log::error_chain(&e)
                );
                emit("vm", "shutdown", &[]);
                return Err(e);
            }
        };
        self.vm = Some(RunningVm {
            boot,
            machine,
            paused: false,
            _terminal,
        });
        self.final_counters = None;
        log::info!("VM rebooted");
        emit("vm", "rebooted", &[]);
        Ok(())
    }

    pub(crate) fn vm_reboot(&mut self) -> ApiResponse {
        emit("vm", "rebooting", &[]);
        if self.vm.is_none() {
            return ApiResponse::error(404, &["vm.reboot", "the VM is not created"]);
        }
        match self.reboot() {
            Ok(()) => ApiResponse::no_content(),
            Err(e) => {
                ApiResponse::from_error_in(status::of_vm(&e), Some("cannot reboot the VM"), &e)
            }
        }
    }

    /// The guest reset the machine: reboot, as upstream does. `Err` is
    /// how the VMM ends when the new VM cannot be made.
    pub(super) fn guest_reset(&mut self) -> Result<(), ExitReason> {
        if self.vm.is_none() {
            log::debug!("a reset request with no VM running: ignored");
            return Ok(());
        }
        log::info!("the guest reset the machine: rebooting");
        emit("vm", "rebooting", &[]);
        self.reboot().map_err(|e| {
            ExitReason::Fatal(format!(
                "the guest reset the VM, and rebooting it failed: {}",
                ch_log::error_chain(&e)
            ))
        })
    }

    pub(crate) fn power_button(&mut self) -> ApiResponse {
        let machine = match self.booted("vm.power-button") {
            Ok(m) => m,
            Err(r) => return r,
        };
        machine.devices.press_power_button();
        log::info!("power button pressed");
        ApiResponse::no_content()
    }

    /// Why disks failed to close when a VM stopped (empty: none did).
    pub fn close_failures(&self) -> &[String] {
        &self.close_failures
    }
}

/// 204, or 500 with `what` and each disk that failed to close.
fn closed_answer(what: &str, failures: Vec<String>) -> ApiResponse {
    if failures.is_empty() {
        return ApiResponse::no_content();
    }
    let mut chain = vec![what.to_string()];
    chain.extend(failures);
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    ApiResponse::error(500, &refs)
}
