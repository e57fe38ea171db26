//! How a disk is opened: the user-facing knobs shared by `--disk`,
//! `ch-storage-daemon --image` and `ch-img`: the options themselves
//! ([`DiskOptions`], `disk_options`), the keys every binary shares
//! ([`take_image_options`], `image_keys`), the `key=value` parser
//! ([`kv`]) and QEMU's cache modes ([`CacheMode`]).

mod cache;
pub mod disk_options;
pub mod image_keys;
pub mod kv;

pub use block_engines::nbd::is_nbd_path;
pub use block_engines::EngineKind;
pub use cache::CacheMode;
pub use disk_options::{DiskOptions, ImageType, SnapshotRef};
pub use image_keys::{take_image_options, MAX_RECONNECT_DELAY};
