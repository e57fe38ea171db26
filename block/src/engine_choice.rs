//! Which engine a disk uses, decided once per disk at open and logged
//! with its reason.
//!
//! `engine=auto`: io_uring where the kernel gives a ring with every
//! opcode the uring engine uses ([`uring_support`]); else Linux AIO, only
//! for an image opened O_DIRECT that is fully allocated
//! ([`allocation`]), because `io_submit` otherwise blocks the
//! queue while the file system allocates; else the thread pool.
//!
//! The engine matrix (docs/performance.md, "Engine x preallocation matrix")
//! backs io_uring first in every cell, fresh fallocated images included:
//! since the rings run task work cooperatively (see the uring engine's
//! `setup`), 4 KiB QD 128 random writes into unwritten extents run about as
//! fast on io_uring as on AIO (112k against 111k IOPS in one run, 102k
//! against 120k in another, 87k against 92k over 7 interleaved repeats)
//! with a submit-time p99 of 50-60 us against AIO's 370-470.
//! (Before that change io_uring wrote there at 0.6 x AIO's rate, and
//! `auto` put such images' writes on AIO.)
//! An explicit `engine=aio` is honoured with a warning where that does not
//! hold, and fails when the kernel refuses AIO ([`aio_support`]).
//!
//! Enters as the user's [`EngineKind`], the O_DIRECT flag and the opened
//! format; leaves as a concrete [`EngineKind`] (never `Auto`).

pub mod allocation;

use crate::formats::Format;
use allocation::Allocated;
use block_engines::aio::aio_support;
use block_engines::probe::uring_support;
use block_engines::EngineKind;

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
            aio: aio_support(),
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
            match (&kernel.aio, allocated()) {
                (_, Err(why)) => Ok(choice(
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
    // handle per worker). For `auto` that is only an O_DIRECT image
    // without io_uring, so the allocation (which the policy needs there
    // anyway) is walked first.
    let uring = uring_support();
    let walk = direct
        && match kind {
            EngineKind::Aio => true,
            EngineKind::Auto => uring.is_err(),
            _ => false,
        };
    let mut allocation = walk.then(|| allocation::fully_allocated(format));
    let aio_candidate = match kind {
        EngineKind::Aio => true,
        EngineKind::Auto => matches!(allocation, Some(Ok(_))),
        _ => false,
    };
    let aio = if aio_candidate {
        aio_support()
    } else {
        Err("not probed: the policy cannot choose it here".into())
    };
    let kernel = KernelSupport { uring, aio };
    let c = choose_engine(kind, direct, &kernel, || {
        allocation
            .take()
            .unwrap_or_else(|| Err("not walked: the policy does not need it here".into()))
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
    fn auto_takes_io_uring_whatever_the_allocation_and_never_scans_for_it() {
        let k = kernel(true, true);
        let mib = 1u64 << 20;
        for direct in [true, false] {
            let c = choose_engine(
                EngineKind::Auto,
                direct,
                &k,
                || -> Result<Allocated, String> {
                    panic!("the allocation scan runs only without io_uring")
                },
            )
            .unwrap();
            assert_eq!(c.kind, EngineKind::IoUring);
        }
        // Without io_uring: AIO for a direct, fully allocated image, with
        // or without unwritten extents; a sparse image gets threads, and
        // the reason is the sparseness even where AIO was not available.
        let no_ring = kernel(false, true);
        assert_eq!(
            auto_unwritten(&no_ring, true, Some(5 * mib)).kind,
            EngineKind::Aio
        );
        assert_eq!(
            auto_unwritten(&no_ring, true, Some(0)).kind,
            EngineKind::Aio
        );
        assert_eq!(
            auto_unwritten(&no_ring, true, None).kind,
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
