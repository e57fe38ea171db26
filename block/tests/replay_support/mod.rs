//! Support for the replay durability test (`replay_durability.rs`): the
//! write-log recorders, the recorded workload, crash images built from the
//! log, and the oracle of what the guest may read back. The test file
//! includes it with `mod support; mod replay_support;` (shared temp dirs,
//! qemu wrappers and the PRNG come from `support`).
#![allow(dead_code)]

pub mod crash;
pub mod oracle;
pub mod record;
pub mod workload;

pub(crate) use crate::support::*;
