//! Shared helpers for every integration test in block/tests: temporary
//! folders, qemu-img/qemu-io wrappers, seeded pseudo-random data, and a
//! tiny synchronous runner for format plans, a per-case deadline and
//! waits for a queue's completions with one. Each test file includes it
//! with `mod support;`; nothing here touches state outside its temp dirs.
#![allow(dead_code, unused_imports)]

pub mod images;
pub mod plan;
pub mod qemu;
pub mod queue;
pub mod rng;
pub mod tmp;

pub use images::*;
pub use plan::*;
pub use qemu::*;
pub use queue::*;
pub use rng::*;
pub use testkit::{output_within, with_deadline, COMMAND_LIMIT};
pub use tmp::*;
