//! The VMM: command line, VM lifecycle, guest memory, boot loading, legacy
//! devices, the PCI bus and the device manager behind the
//! `cloud-hypervisor` binary.
//!
//! `main` parses the command line ([`config`]), opens the disks
//! ([`device_manager::open_disks`]), then [`vm::run`] starts the API
//! server ([`api`], with `--api-socket`, routing by the endpoint table
//! [`endpoints`]), creates the VM, loads the guest
//! ([`boot`]), builds the devices ([`device_manager`]), runs the vCPU
//! threads ([`vcpu`]) under seccomp ([`seccomp`]) and hands the main
//! thread to the control loop ([`control`]) until the end.

pub mod api;
pub mod boot;
pub mod config;
pub mod control;
pub mod device_manager;
pub mod devices;
pub mod disk_registry;
pub mod endpoints;
pub mod layout;
pub mod memory;
pub mod pci_attach;
pub mod seccomp;
pub mod signals;
pub mod terminal;
pub mod vcpu;
pub mod vcpu_pause;
pub mod vhost_user_disks;
pub mod vm;
