//! Which engine a disk uses, decided once per disk at open and logged
//! with its reason.
//!
//! `engine=auto`: Linux AIO for an image opened O_DIRECT that is fully
//! allocated and still has fallocated, never-written extents (a fresh
//! `preallocation=falloc` image); else io_uring where the kernel gives a
//! ring with every opcode the uring engine uses ([`uring_support`]);
//! else Linux AIO, again only for an image opened O_DIRECT that is fully
//! allocated ([`super::allocation`]), because `io_submit` otherwise
//! blocks the queue while the file system allocates; else the thread
//! pool.
//!
//! Why AIO first on unwritten extents: the engine matrix
//! (docs/performance.md) measured 4 KiB QD 128 random writes into a
//! fresh falloc image at 109k IOPS with aio against 70k with io_uring.
//! The first write to an unwritten block converts its extent inside the
//! submit call (about 8 us of kernel time per write here, fio too);
//! io_uring's submit chunks are cut to a time budget (see the uring
//! engine) so that one enter never holds the queue for long, while
//! `io_submit` takes the whole batch under one block plug. The image is
//! fully allocated, so io_submit does not block on allocation: the case
//! the study calls safe. On reads and on written blocks the two engines
//! measured within a few percent of each other.
//! An explicit `engine=aio` is honoured with a warning where that does not
//! hold, and fails when the kernel refuses AIO ([`super::aio::aio_support`]).
//!
//! Enters as the user's [`EngineKind`], the O_DIRECT flag and the opened
//! format; leaves as a concrete [`EngineKind`] (never `Auto`).

use std::sync::OnceLock;

use io_uring::{opcode, IoUring, Probe};

use super::allocation::Allocated;
use crate::formats::Format;
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

/// What the kernel offers (each `Err` says why not).
pub struct KernelSupport {
    pub uring: Result<(), String>,
    pub aio: Result<(), String>,
}

impl KernelSupport {
    /// This kernel, now (io_uring cached per process; AIO asked each time,
    /// since `aio-max-nr` fills up and empties).
    pub fn probe() -> Self {
        KernelSupport {
            uring: uring_support(),
            aio: super::aio::aio_support(),
        }
    }
}

/// An engine choice: the engine, why, and what the user should know.
#[derive(Debug, PartialEq, Eq)]
pub struct EngineChoice {
    pub kind: EngineKind,
    pub reason: String,
    pub warning: Option<String>,
}

/// The policy of the module docs. `allocated` says whether the image is
/// fully allocated (asked only when the answer matters). `Err` when an
/// explicit `engine=aio` cannot work on this kernel.
pub fn choose_engine(
    kind: EngineKind,
    direct: bool,
    kernel: &KernelSupport,
    allocated: impl FnOnce() -> Result<Allocated, String>,
) -> Result<EngineChoice, String> {
    let choice = |kind, reason: String| EngineChoice {
        kind,
        reason,
        warning: None,
    };
    match kind {
        EngineKind::Auto => {
            let allocation = direct.then(allocated);
            if let (Some(Ok(a)), Ok(())) = (&allocation, &kernel.aio) {
                if a.unwritten > 0 {
                    let mib = a.unwritten >> 20;
                    let why = "first writes convert extents inside the submit call, which Linux AIO batches";
                    return Ok(match kernel.uring {
                        Ok(()) => choice(
                            EngineKind::IoUringAio,
                            format!(
                                "O_DIRECT on a fully allocated image with {mib} MiB in fallocated, never-written extents: reads on io_uring (they need no device I/O and complete inside the submit call), the rest on Linux AIO ({why})"
                            ),
                        ),
                        Err(_) => choice(
                            EngineKind::Aio,
                            format!(
                                "O_DIRECT on a fully allocated image with {mib} MiB in fallocated, never-written extents: {why}"
                            ),
                        ),
                    });
                }
            }
            let no_uring = match &kernel.uring {
                Ok(()) => {
                    return Ok(choice(
                        EngineKind::IoUring,
                        "ring and opcodes READV, WRITEV, FSYNC, FALLOCATE available".into(),
                    ))
                }
                Err(why) => why,
            };
            if !direct {
                return Ok(choice(
                    EngineKind::Threads,
                    format!("no io_uring ({no_uring}); not O_DIRECT, so Linux AIO would run synchronously"),
                ));
            }
            match (&kernel.aio, allocation) {
                (_, Some(Err(why))) => Ok(choice(
                    EngineKind::Threads,
                    format!("no io_uring ({no_uring}); the image is sparse ({why}), so io_submit could block"),
                )),
                (Err(why), _) => Ok(choice(
                    EngineKind::Threads,
                    format!("no io_uring ({no_uring}); Linux AIO unavailable ({why})"),
                )),
                (Ok(()), _) => Ok(choice(
                    EngineKind::Aio,
                    format!("no io_uring ({no_uring}); O_DIRECT on a fully allocated image"),
                )),
            }
        }
        EngineKind::Aio => {
            kernel.aio.clone()?;
            let warning = if !direct {
                Some(
                    "engine=aio without O_DIRECT: the kernel runs every read and write synchronously inside io_submit, on the queue's thread".to_string(),
                )
            } else {
                allocated().err().map(|why| {
                    format!(
                        "engine=aio on a sparse image ({why}): io_submit blocks the queue's thread while the file system allocates blocks for a write into unallocated space; preallocate (falloc/full) or use io_uring or threads"
                    )
                })
            };
            Ok(EngineChoice {
                kind,
                reason: "asked for".into(),
                warning,
            })
        }
        other => Ok(choice(other, "asked for".into())),
    }
}

/// Guest size up to which `auto` walks a whole image's mapping at open to
/// see whether AIO's unwritten-extent case applies: at 64 KiB clusters
/// that reads at most 16 MiB of L2 tables.
const UNWRITTEN_WALK_MAX_SIZE: u64 = 128 << 30;

/// Whether `auto` (with io_uring available) should walk the image's
/// mapping for the unwritten-extent case: only when its files have an
/// unwritten extent at all (one FIEMAP pass, no metadata read) and the
/// walk is bounded ([`UNWRITTEN_WALK_MAX_SIZE`]).
fn worth_walking_for_unwritten(format: &dyn Format) -> bool {
    format.size() <= UNWRITTEN_WALK_MAX_SIZE && super::allocation::files_have_unwritten(format)
}

/// Resolves the engine of the disk at `path` (logging the choice and any
/// warning). `Err` says why an explicit `engine=aio` cannot work.
pub fn resolve_engine(
    kind: EngineKind,
    direct: bool,
    format: &dyn Format,
    path: &std::path::Path,
) -> Result<EngineKind, String> {
    // Linux AIO is asked for only where the policy can pick it: a probe
    // is an io_setup and an io_destroy, and io_destroy waits for an RCU
    // grace period (~30 ms here), on every open (ch-img convert opens a
    // handle per worker). For `auto` on an O_DIRECT image that is only
    // without io_uring or on an image with unwritten extents, so the
    // allocation (which the policy needs there anyway) is walked first.
    let uring = uring_support();
    let walk = direct
        && match kind {
            EngineKind::Aio => true,
            EngineKind::Auto => uring.is_err() || worth_walking_for_unwritten(format),
            _ => false,
        };
    let mut allocation = walk.then(|| super::allocation::fully_allocated(format));
    let aio_candidate = match kind {
        EngineKind::Aio => true,
        EngineKind::Auto => match &allocation {
            Some(Ok(a)) => uring.is_err() || a.unwritten > 0,
            Some(Err(_)) | None => false,
        },
        _ => false,
    };
    let aio = if aio_candidate {
        super::aio::aio_support()
    } else {
        Err("not probed: the policy cannot choose it here".into())
    };
    let kernel = KernelSupport { uring, aio };
    let c = choose_engine(kind, direct, &kernel, || {
        allocation
            .take()
            .unwrap_or_else(|| Err("not walked: no unwritten extent in the image's files".into()))
    })?;
    if let Some(w) = &c.warning {
        log::warn!("disk {}: {w}", path.display());
    }
    if kind == EngineKind::Auto {
        log::info!(
            "disk {}: engine=auto -> {} ({})",
            path.display(),
            c.kind,
            c.reason
        );
    }
    Ok(c.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(uring: bool, aio: bool) -> KernelSupport {
        let r = |ok: bool, why: &str| if ok { Ok(()) } else { Err(why.to_string()) };
        KernelSupport {
            uring: r(uring, "no ring"),
            aio: r(aio, "io_setup failed: EAGAIN"),
        }
    }

    fn sparse() -> Result<Allocated, String> {
        Err("hole at 0".into())
    }

    fn sparse_or(unwritten: Option<u64>) -> Result<Allocated, String> {
        match unwritten {
            Some(unwritten) => Ok(Allocated { unwritten }),
            None => Err("hole at 0".into()),
        }
    }

    fn auto(k: &KernelSupport, direct: bool, allocated: bool) -> EngineChoice {
        auto_unwritten(k, direct, allocated.then_some(0))
    }

    /// `unwritten`: `None` for a sparse image, else its unwritten bytes.
    fn auto_unwritten(k: &KernelSupport, direct: bool, unwritten: Option<u64>) -> EngineChoice {
        choose_engine(EngineKind::Auto, direct, k, move || sparse_or(unwritten)).unwrap()
    }

    #[test]
    fn auto_prefers_uring_then_aio_only_when_safe_then_threads() {
        assert_eq!(
            auto(&kernel(true, true), false, false).kind,
            EngineKind::IoUring
        );
        let k = kernel(false, true);
        assert_eq!(auto(&k, true, true).kind, EngineKind::Aio);
        let c = auto(&k, true, false);
        assert_eq!(c.kind, EngineKind::Threads);
        assert!(
            c.reason.contains("sparse") && c.reason.contains("no ring"),
            "{}",
            c.reason
        );
        let c = auto(&k, false, true);
        assert_eq!(c.kind, EngineKind::Threads);
        assert!(c.reason.contains("O_DIRECT"), "{}", c.reason);
        let c = auto(&kernel(false, false), true, true);
        assert_eq!(c.kind, EngineKind::Threads);
        assert!(c.reason.contains("EAGAIN"), "{}", c.reason);
    }

    #[test]
    fn auto_takes_aio_for_direct_unwritten_extents_only() {
        let k = kernel(true, true);
        let mib = 1u64 << 20;
        // With io_uring: reads on it, the rest on AIO.
        let c = auto_unwritten(&k, true, Some(5 * mib));
        assert_eq!(c.kind, EngineKind::IoUringAio);
        assert!(c.reason.contains("5 MiB"), "{}", c.reason);
        // Without: all on AIO.
        let c = auto_unwritten(&kernel(false, true), true, Some(5 * mib));
        assert_eq!(c.kind, EngineKind::Aio);
        assert!(c.reason.contains("5 MiB"), "{}", c.reason);
        // Written, buffered, sparse, or no AIO: io_uring as before.
        assert_eq!(auto_unwritten(&k, true, Some(0)).kind, EngineKind::IoUring);
        assert_eq!(
            auto_unwritten(&k, false, Some(mib)).kind,
            EngineKind::IoUring
        );
        assert_eq!(auto_unwritten(&k, true, None).kind, EngineKind::IoUring);
        let no_aio = kernel(true, false);
        assert_eq!(
            auto_unwritten(&no_aio, true, Some(mib)).kind,
            EngineKind::IoUring
        );
        // Without io_uring a sparse image still gets threads, never AIO,
        // and the reason is the sparseness even where AIO was not asked.
        assert_eq!(
            auto_unwritten(&kernel(false, true), true, None).kind,
            EngineKind::Threads
        );
        let c = auto_unwritten(&kernel(false, false), true, None);
        assert_eq!(c.kind, EngineKind::Threads);
        assert!(c.reason.contains("sparse"), "{}", c.reason);
    }

    #[test]
    fn explicit_aio_warns_on_sparse_or_buffered_and_fails_without_aio() {
        let k = kernel(true, true);
        let c = choose_engine(EngineKind::Aio, true, &k, sparse).unwrap();
        assert_eq!(c.kind, EngineKind::Aio);
        assert!(c.warning.unwrap().contains("allocates"));
        let c = choose_engine(EngineKind::Aio, false, &k, || sparse_or(Some(0))).unwrap();
        assert!(c.warning.unwrap().contains("O_DIRECT"));
        let c = choose_engine(EngineKind::Aio, true, &k, || sparse_or(Some(0))).unwrap();
        assert_eq!(c.warning, None);
        let err = choose_engine(EngineKind::Aio, true, &kernel(true, false), || {
            sparse_or(Some(0))
        });
        assert!(err.unwrap_err().contains("io_setup"));
    }

    #[test]
    fn explicit_engines_pass_through() {
        let k = kernel(false, false);
        for kind in [EngineKind::Sync, EngineKind::Threads, EngineKind::IoUring] {
            assert_eq!(choose_engine(kind, false, &k, sparse).unwrap().kind, kind);
        }
    }

    #[test]
    fn this_kernel_resolves_auto_to_a_concrete_engine() {
        let k = KernelSupport::probe();
        let c = choose_engine(EngineKind::Auto, true, &k, || sparse_or(Some(0))).unwrap();
        assert_ne!(c.kind, EngineKind::Auto);
        assert_eq!(c.kind == EngineKind::IoUring, uring_support().is_ok());
    }
}
