//! The VMM: command line, VM lifecycle, guest memory, boot loading, legacy
//! devices, the PCI bus and the device manager behind the
//! `cloud-hypervisor` binary.
//!
//! `main` parses the command line ([`config`]), opens the disks
//! ([`device_manager::open_disks`]), then [`vm::run`] creates the VM,
//! loads the guest ([`boot`]), builds the devices ([`device_manager`]),
//! runs the vCPU threads ([`vcpu`]) under seccomp ([`seccomp`]) and waits
//! for the end.

pub mod boot;
pub mod config;
pub mod device_manager;
pub mod devices;
pub mod layout;
pub mod memory;
pub mod seccomp;
pub mod signals;
pub mod terminal;
pub mod vcpu;
pub mod vhost_user_disks;
pub mod vm;
