//! Whether this kernel gives io_uring everything the uring engine uses
//! ([`uring_support`], asked once per process); Linux AIO's own probe is
//! [`crate::aio::aio_support`].

use std::sync::OnceLock;

use io_uring::{opcode, IoUring, Probe};

/// The opcodes the uring engine issues.
const NEEDED: &[(u8, &str)] = &[
    (opcode::Readv::CODE, "READV"),
    (opcode::Writev::CODE, "WRITEV"),
    (opcode::Fsync::CODE, "FSYNC"),
    (opcode::Fallocate::CODE, "FALLOCATE"),
];

/// `Ok(())` when io_uring is usable here, else why not (cached).
pub fn uring_support() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe_kernel).clone()
}

fn probe_kernel() -> Result<(), String> {
    let ring = IoUring::new(4).map_err(|e| format!("io_uring_setup failed: {e}"))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("IORING_REGISTER_PROBE failed: {e}"))?;
    let missing: Vec<&str> = NEEDED
        .iter()
        .filter(|(code, _)| !probe.is_supported(*code))
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "kernel lacks io_uring opcodes {}",
            missing.join(", ")
        ))
    }
}
