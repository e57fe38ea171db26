//! The bottom floor of the workspace: small pieces that know nothing of
//! images, devices or the VM, used by several crates above them (block,
//! virtio-devices, vmm, ch-storage-daemon, ch-img, the benchmarks). A
//! piece belongs here when two or more crates need it and it names no
//! type of theirs; this crate depends on no other crate of the workspace.
//!
//! - [`kv`]: the `key=value,key=value` syntax of every option group
//!   (`cloud-hypervisor --disk`, `ch-storage-daemon --image/--export`),
//!   and `on|off` values. The image keys themselves are block's
//!   (`block::options::take_image_options`), parsed with this.
//! - [`size`]: sizes with binary suffixes (`512M`, `1.5G`, `0x10000`,
//!   `2GiB`), the one parser of every binary's size arguments.
//! - [`adaptive_poll`]: how long a queue thread spins before it sleeps
//!   (the virtio-blk queue workers, the storage daemon's FUSE threads).
//!
//! Named for what it is, a utility crate, because what it holds has no
//! one domain; each module's doc says how data enters and leaves it.

pub mod adaptive_poll;
pub mod kv;
pub mod size;
