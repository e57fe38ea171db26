//! `engine=auto`: whether this kernel gives an io_uring with every opcode
//! the uring engine uses, decided once per process.
//!
//! [`resolve_engine`] turns the user's choice into `IoUring` or `Sync` and
//! logs one line with the reason; [`uring_support`] is the probe itself.

use std::path::Path;
use std::sync::OnceLock;

use io_uring::{opcode, IoUring, Probe};

use crate::options::EngineKind;

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

/// Resolves `Auto` (logging the choice for `path`); other kinds pass
/// through.
pub fn resolve_engine(kind: EngineKind, path: &Path) -> EngineKind {
    if kind != EngineKind::Auto {
        return kind;
    }
    match uring_support() {
        Ok(()) => {
            log::info!(
                "disk {}: engine=auto -> io_uring (ring and opcodes READV, WRITEV, FSYNC, FALLOCATE available)",
                path.display()
            );
            EngineKind::IoUring
        }
        Err(why) => {
            log::info!("disk {}: engine=auto -> sync ({why})", path.display());
            EngineKind::Sync
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_resolves_to_a_concrete_engine() {
        let k = resolve_engine(EngineKind::Auto, Path::new("x"));
        assert_ne!(k, EngineKind::Auto);
        assert_eq!(k == EngineKind::IoUring, uring_support().is_ok());
        assert_eq!(
            resolve_engine(EngineKind::Sync, Path::new("x")),
            EngineKind::Sync
        );
    }
}
