//! A host-side virtio driver for tests and benchmarks (and the `blk-bench`
//! binary, `src/bin/blk-bench/`, built on it).
//!
//! It plays the guest: split virtqueues in a `GuestMemoryMmap`
//! ([`split_queue`]), an interrupt sink with one eventfd per queue
//! ([`interrupt`]), and a virtio-blk driver that posts requests, kicks the
//! device's real worker threads and reaps used entries ([`blk_driver`]).
//! It reaches the device only through virtio-devices' public API
//! (`BlockDevice`, `VirtioDevice`, `VirtioInterrupt`). It is a crate of its
//! own so the VMM's build does not carry it (nor serde_json, which only
//! `blk-bench` needs); virtio-devices' integration tests take it as a
//! dev-dependency.

pub mod blk_driver;
pub mod interrupt;
pub mod split_queue;

pub use blk_driver::{BlockHarness, DriverOptions, QueueDriver, Slot, UsedRequest};
pub use interrupt::EventFdInterrupt;
pub use split_queue::{DescSpec, DriverQueue, QueueLayout};
