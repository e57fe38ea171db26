//! What can go wrong making, booting or running the VM, for the VMM's
//! front end (one line on stderr, exit 1) and the API (a status through
//! `crate::control::status`).

use thiserror::Error;

use crate::api::socket::SocketError;
use crate::boot::error::BootError;
use crate::device_error::DeviceError;
use crate::exit::ExitReason;
use crate::memory::MemoryError;
use crate::seccomp::SeccompError;

#[derive(Debug, Error)]
pub enum VmError {
    #[error("cannot create the VM")]
    CreateVm(#[source] hypervisor::HypervisorError),
    #[error("cannot set up guest memory")]
    Memory(#[source] MemoryError),
    #[error("cannot load the guest")]
    LoadGuest(#[source] BootError),
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
    #[error("cannot start the event monitor")]
    EventMonitor(#[source] std::io::Error),
    #[error("--event-monitor: {0}")]
    EventMonitorFile(String),
    #[error("cannot install the SIGSYS handler")]
    Sigsys(#[source] std::io::Error),
    #[error("cannot start the NBD connector thread")]
    NbdConnector(#[source] std::io::Error),
    #[error("cannot start the nbd-export thread")]
    NbdExports(#[source] std::io::Error),
    #[error("cannot start the vm-builder thread")]
    Builder(#[source] std::io::Error),
    #[error("the vm-builder thread is gone")]
    BuilderGone,
    #[error("the VM is not created")]
    NotCreated,
    #[error("invalid VM configuration")]
    Config(#[source] crate::config::VmConfigError),
    #[error("cannot open the disks")]
    OpenDisks(#[source] DeviceError),
}
