//! Block jobs (docs/block-jobs.md, docs/live-operations.md "Jobs"): long
//! copies on a running disk, each on a thread of its own with its own
//! queues on the disk's engines, never on a vCPU, queue-worker or API
//! thread.
//!
//! [`Job`] is the thread and [`JobShared`] the record it shares with its
//! owner: state (`created`, `running`, `ready`, `completed`, `failed`,
//! `cancelled`), bytes done and total, rate, rate limit ([`rate`]),
//! error; cancel, park and stop requests, seen between two chunks. The
//! mirror ([`mirror`]) copies a disk to a target ([`mirror_target`])
//! through [`copy`] and a dirty bitmap on the disk's write seam
//! (`crate::live`); in write-blocking mode its filter on that seam
//! ([`write_blocking`]) also writes each guest write to the target,
//! kept apart from the copier's batches by [`granule_claims`]. A stream
//! ([`stream`]) populates the running image from its backing chain
//! ([`populate`]); a commit ([`commit`]) copies an intermediate layer
//! into its base, and an active commit is a mirror into the base
//! (`SyncMode::Above`); [`chain`] names the layers. A job never touches
//! the device: the switch of a
//! running disk to the target belongs to its owner, which holds the
//! jobs (one per disk) and ends them when the VM stops.

pub mod chain;
pub mod commit;
pub mod copy;
pub mod granule_claims;
pub mod job;
pub mod mirror;
pub mod mirror_target;
pub mod populate;
pub mod rate;
pub mod stream;
pub mod write_blocking;

pub use chain::{find_layer, layers_of, Layer};
pub use commit::Commit;
pub use job::{Flow, Job, JobShared, JobState, JobStatus};
pub use mirror::{Mirror, MirrorMode};
pub use mirror_target::{open_target, MirrorTarget, SyncMode, TargetError, TargetSpec};
pub use stream::Stream;

#[cfg(test)]
mod copy_tests;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_blocking_tests;
