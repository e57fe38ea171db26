//! The VMM: command line, VM lifecycle, guest memory, boot loading, legacy
//! devices, the PCI bus and the device manager behind the
//! `cloud-hypervisor` binary.
//!
//! `main` parses the command line ([`config`]) and starts the threads
//! that must exist before any seccomp filter ([`vm::prepare_process`]:
//! the NBD connector, the [`vm_builder`], the [`nbd_exports`] thread,
//! the [`events`] monitor); then
//! [`vm::run`] starts the API server ([`api`], with `--api-socket`,
//! routing by the endpoint table [`endpoints`]) and hands the main thread
//! to the control loop ([`control`]), which creates and boots the VM
//! (the command line's, or `vm.create`'s): the disks opened
//! ([`device_manager::open_disks`]), then on the builder thread the KVM
//! VM, the guest loaded ([`boot`]), the devices ([`device_manager`]) and
//! the vCPU threads ([`vcpu`]), as one [`machine`], each thread under
//! its seccomp filter ([`seccomp`]). A reboot builds a new machine
//! around the same open disks; the loop runs until the VMM ends.

pub mod api;
pub mod boot;
pub mod config;
pub mod control;
pub mod device_error;
pub mod device_manager;
pub mod devices;
pub mod disk_registry;
pub mod endpoints;
pub mod events;
pub mod exit;
pub mod layout;
pub mod machine;
pub mod memory;
pub mod nbd_exports;
pub mod pci_attach;
pub mod seccomp;
pub mod signals;
pub mod terminal;
pub mod vcpu;
pub mod vcpu_pause;
pub mod vcpu_thread;
pub mod vhost_user_disks;
pub mod vm;
pub mod vm_builder;
pub mod vm_error;
