//! How a disk is opened: the user-facing knobs shared by `--disk`,
//! `ch-storage-daemon --image` and `ch-img`: the options themselves
//! ([`DiskOptions`], `disk_options`), the keys every binary shares
//! ([`take_image_options`], `image_keys`, reading a `key=value` list of
//! `ch_util::kv`), the rules between those keys that the VMM's JSON disk
//! config follows too ([`rules`]), and QEMU's cache modes
//! ([`CacheMode`]).

mod cache;
pub mod disk_options;
pub mod image_keys;
pub mod rules;

pub use block_engines::nbd::is_nbd_path;
pub use block_engines::EngineKind;
pub use cache::CacheMode;
pub use disk_options::{DiskOptions, ImageType, SnapshotRef};
pub use image_keys::take_image_options;
