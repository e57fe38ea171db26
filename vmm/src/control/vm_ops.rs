//! The running VM's state: `vm.counters`, `vm.pause`, `vm.resume`
//! (`vmm.ping` and `vm.info` are [`super::info`]'s, the lifecycle
//! [`super::lifecycle`]'s).
//!
//! Pause stops the vCPUs first (the gate, [`crate::vcpu_pause`]), then
//! pauses every in-VMM disk, which answers once its requests in flight
//! have completed; resume goes the other way. A failure half-way undoes
//! what was done. Counters live in the disks' devices, which a reboot
//! keeps, so they go on across reboots; after `vm.shutdown` the last
//! counts are kept until the next boot.

use serde_json::{json, Map, Value};

use super::{Control, VmState};
use crate::api::ApiResponse;
use crate::events::emit;

impl Control {
    pub(crate) fn counters(&self) -> ApiResponse {
        if self.vm.is_some() {
            return ApiResponse::json(&self.counters_now());
        }
        match &self.final_counters {
            Some(last) => ApiResponse::json(last),
            None => ApiResponse::error(500, &["vm.counters", "the VM is not running"]),
        }
    }

    /// Each in-VMM disk's counters, summed over its queues.
    pub(super) fn counters_now(&self) -> Value {
        let mut all = Map::new();
        let disks = self.vm.iter().flat_map(|v| v.machine.devices.disks.iter());
        for d in disks {
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
        let machine = match self.booted("vm.pause") {
            Ok(m) => m,
            Err(r) => return r,
        };
        match self.state() {
            VmState::Running => {}
            s => {
                return ApiResponse::error(500, &[&format!("cannot pause: the VM is {}", s.name())])
            }
        }
        emit("vm", "pausing", &[]);
        if let Err(e) = machine.gate.pause(&machine.vcpus) {
            return ApiResponse::error(500, &["cannot pause the vCPUs", &e]);
        }
        let disks = &machine.devices.disks;
        let mut paused: Vec<String> = Vec::new();
        for d in disks.iter() {
            let Some(mut dev) = d.lock_device() else {
                continue;
            };
            if let Err(e) = dev.pause() {
                drop(dev);
                for id in &paused {
                    if let Some(mut dev) = disks.find(id).and_then(|d| d.lock_device()) {
                        dev.resume();
                    }
                }
                machine.gate.resume();
                let what = format!("cannot pause disk {}", d.id);
                return ApiResponse::error(500, &[&what, &e.to_string()]);
            }
            paused.push(d.id.clone());
        }
        if let Some(vm) = self.vm.as_mut() {
            vm.paused = true;
        }
        log::info!("VM paused");
        emit("vm", "paused", &[]);
        ApiResponse::no_content()
    }

    pub(crate) fn resume(&mut self) -> ApiResponse {
        let machine = match self.booted("vm.resume") {
            Ok(m) => m,
            Err(r) => return r,
        };
        if self.state() != VmState::Paused {
            return ApiResponse::error(
                500,
                &[&format!("cannot resume: the VM is {}", self.state().name())],
            );
        }
        emit("vm", "resuming", &[]);
        for d in machine.devices.disks.iter() {
            if let Some(mut dev) = d.lock_device() {
                dev.resume();
            }
        }
        machine.gate.resume();
        if let Some(vm) = self.vm.as_mut() {
            vm.paused = false;
        }
        log::info!("VM resumed");
        emit("vm", "resumed", &[]);
        ApiResponse::no_content()
    }
}
