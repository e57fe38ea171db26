//! A host-side virtio driver for tests and benchmarks.
//!
//! It plays the guest: split virtqueues in a `GuestMemoryMmap`
//! ([`split_queue`]), an interrupt sink with one eventfd per queue
//! ([`interrupt`]), and a virtio-blk driver that posts requests, kicks the
//! device's real worker threads and reaps used entries ([`blk_driver`]).
//! Nothing here is used by the VMM itself.

pub mod blk_driver;
pub mod interrupt;
pub mod split_queue;

pub use blk_driver::{BlockHarness, DriverOptions, QueueDriver, Slot, UsedRequest};
pub use interrupt::EventFdInterrupt;
pub use split_queue::{DescSpec, DriverQueue, QueueLayout};
