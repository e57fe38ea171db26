//! The VM-wide requests: `vmm.shutdown`, `vm.counters`, `vm.pause`,
//! `vm.resume`, `vm.shutdown`, `vm.reboot` (`vmm.ping` and `vm.info` are
//! [`super::info`]'s).
//!
//! Pause stops the vCPUs first (the gate, [`crate::vcpu_pause`]), then
//! pauses every in-VMM disk, which answers once its requests in flight
//! have completed; resume goes the other way. A failure half-way undoes
//! what was done.

use serde_json::{json, Map, Value};

use super::{Control, VmState};
use crate::api::ApiResponse;
use crate::vm::{stop_vcpus, ExitReason};

impl Control {
    pub(crate) fn vmm_shutdown(&mut self) -> ApiResponse {
        // The VM is stopped and its disks closed by the caller of `run`
        // (vm::run) once the loop returns; the answer goes out first.
        self.exit.request(ExitReason::ApiShutdown);
        ApiResponse::no_content()
    }

    pub(crate) fn counters(&self) -> ApiResponse {
        match &self.final_counters {
            Some(last) => ApiResponse::json(last),
            None => ApiResponse::json(&self.counters_now()),
        }
    }

    /// Each in-VMM disk's counters, summed over its queues.
    fn counters_now(&self) -> Value {
        let mut all = Map::new();
        for d in self.devices.disks.iter() {
            if let Some(dev) = d.device() {
                let totals = dev
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .counters()
                    .totals();
                let m: Map<String, Value> = totals
                    .entries()
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(v)))
                    .collect();
                all.insert(d.id.clone(), Value::Object(m));
            }
        }
        Value::Object(all)
    }

    pub(crate) fn pause(&mut self) -> ApiResponse {
        if let Some(r) = self.refuse_when_shut("vm.pause") {
            return r;
        }
        match self.state {
            VmState::Running => {}
            s => {
                return ApiResponse::error(500, &[&format!("cannot pause: the VM is {}", s.name())])
            }
        }
        if let Err(e) = self.gate.pause(&self.vcpus) {
            return ApiResponse::error(500, &["cannot pause the vCPUs", &e]);
        }
        let mut paused: Vec<String> = Vec::new();
        for d in self.devices.disks.iter() {
            let Some(mut dev) = d.lock_device() else {
                continue;
            };
            if let Err(e) = dev.pause() {
                drop(dev);
                for id in &paused {
                    if let Some(mut dev) = self.devices.disks.find(id).and_then(|d| d.lock_device())
                    {
                        dev.resume();
                    }
                }
                self.gate.resume();
                let what = format!("cannot pause disk {}", d.id);
                return ApiResponse::error(500, &[&what, &e.to_string()]);
            }
            paused.push(d.id.clone());
        }
        self.state = VmState::Paused;
        log::info!("VM paused");
        ApiResponse::no_content()
    }

    pub(crate) fn resume(&mut self) -> ApiResponse {
        if let Some(r) = self.refuse_when_shut("vm.resume") {
            return r;
        }
        if self.state != VmState::Paused {
            return ApiResponse::error(
                500,
                &[&format!("cannot resume: the VM is {}", self.state.name())],
            );
        }
        for d in self.devices.disks.iter() {
            if let Some(mut dev) = d.lock_device() {
                dev.resume();
            }
        }
        self.gate.resume();
        self.state = VmState::Running;
        log::info!("VM resumed");
        ApiResponse::no_content()
    }

    pub(crate) fn reboot(&mut self) -> ApiResponse {
        ApiResponse::error(
            501,
            &["vm.reboot is not supported yet: a guest reset ends this VMM (docs/api.md)"],
        )
    }

    pub(crate) fn vm_shutdown(&mut self) -> ApiResponse {
        if let Some(r) = self.refuse_when_shut("vm.shutdown") {
            return r;
        }
        self.stop_vm();
        log::info!("the VMM keeps serving the API until vmm.shutdown");
        if self.close_failures.is_empty() {
            return ApiResponse::no_content();
        }
        let mut chain = vec!["the VM is shut down, but closing disks failed".to_string()];
        chain.extend(self.close_failures.iter().cloned());
        let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
        ApiResponse::error(500, &refs)
    }

    /// Stops the vCPUs, finishes the removals still waiting, then takes
    /// every disk off the bus: drained, flushed, closed, its files closed
    /// and its locks released when this returns. What failed to close is
    /// kept in `close_failures` (the VMM's exit status reports it).
    pub fn stop_vm(&mut self) {
        if self.state == VmState::Shutdown {
            return;
        }
        stop_vcpus(std::mem::take(&mut self.vcpus), &self.gate);
        self.state = VmState::Shutdown;
        self.finish_removals_now();
        self.retired = self.disk_configs();
        self.final_counters = Some(self.counters_now());
        let ids: Vec<String> = self.devices.disks.iter().map(|d| d.id.clone()).collect();
        for id in ids {
            if let Some(Err(e)) = self.retire_disk(&id) {
                self.close_failures.push(format!("disk '{id}': {e}"));
            }
        }
        // Whatever else is on the bus.
        self.devices.shutdown();
        if self.close_failures.is_empty() {
            log::info!("VM shut down: vCPUs stopped, disks closed");
        } else {
            log::error!(
                "VM shut down: vCPUs stopped; closing disks failed: {}",
                self.close_failures.join("; ")
            );
        }
    }

    /// Why disks failed to close when the VM stopped (empty: none did).
    pub fn close_failures(&self) -> &[String] {
        &self.close_failures
    }
}
