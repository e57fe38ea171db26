//! The worker's epoll tokens: which source woke it. The event loop
//! (`mod.rs`) registers the sources; the command handling (`commands.rs`)
//! moves the completion source to a new queue at an image switch.

pub(super) const KICK: u64 = 0;
pub(super) const COMPLETION: u64 = 1;
pub(super) const CONTROL: u64 = 2;
pub(super) const THROTTLE_TIMER: u64 = 3;
