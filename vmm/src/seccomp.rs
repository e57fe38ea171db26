//! seccomp-bpf allow-lists per thread kind, built with seccompiler.
//!
//! - [`ThreadKind::Vcpu`]: KVM_RUN and device emulation, including device
//!   reset (draining workers) and starting the activation thread. `ioctl`
//!   only with the KVM requests in [`hypervisor::ioctls::VCPU_THREAD_IOCTLS`]
//!   (run, MSI routes, ioeventfd moves, IRQ line, MSI injection).
//! - [`ThreadKind::QueueWorker`]: block queue workers: epoll, eventfds,
//!   every engine (preadv/pwritev, fdatasync, fallocate;
//!   io_uring_setup/enter/register; io_setup/submit/getevents/destroy;
//!   the threads engine's pool workers start from the queue worker and
//!   inherit its filter), and creating threads (only
//!   `clone` with CLONE_THREAD; `clone3`, whose flags a filter cannot
//!   see, fails with ENOSYS so the C library falls back to `clone`). No
//!   ioctl, no file opening. The virtio-pci transport installs it in the
//!   thread that activates a device, so every worker inherits it.
//! - [`ThreadKind::Main`]: the control loop: waiting for the end or an
//!   API request, stopping and pausing vCPUs (tgkill), shutting devices
//!   down (joining workers, flushing, closing), and what API requests
//!   need: opening a hot-added image (and reading a backing chain's
//!   headers), resizing and snapshotting images, wiring a hot-added
//!   function into KVM; `ioctl` only for TCGETS/TCSETS (restoring the
//!   terminal) and the KVM VM requests of hotplug (irqfd, ioeventfd,
//!   GSI routing).
//! - [`ThreadKind::Api`]: the API server: accepting on its socket,
//!   reading and writing connections with timeouts, starting a thread
//!   per connection (`clone` with CLONE_THREAD only, as for workers), and
//!   waking the control loop (an eventfd write). No file opening, no
//!   ioctl, no image I/O.
//!
//! Enforce mode kills the process on anything else; log mode allows it
//! but has the kernel log it (audit). Filters are installed after set-up,
//! so opening images, loading the kernel and creating the VM are not
//! restricted.
//!
//! Opening a file (`openat`, `open`) in a vCPU, queue-worker or API
//! thread fails with EACCES instead of killing the process: no file is
//! opened either way, but the C library opens files lazily on its own
//! (glibc's malloc reads /proc/sys/vm/overcommit_memory the first time it
//! shrinks a thread's heap, at a moment that depends on what was freed),
//! and it copes with the failure.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use thiserror::Error;

use crate::config::SeccompMode;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    Main,
    Vcpu,
    QueueWorker,
    Api,
}

#[derive(Debug, Error)]
pub enum SeccompError {
    #[error("cannot build seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    #[error("cannot compile seccomp filter")]
    Compile(#[source] seccompiler::BackendError),
    #[error("cannot apply seccomp filter")]
    Apply(#[source] seccompiler::Error),
}

/// Fixes glibc's malloc arena limit before any filter is installed.
///
/// Left unset, glibc computes it the first time a thread needs a new arena
/// (more than 8 threads allocating at once) by reading
/// /sys/devices/system/cpu/online; under our filters that `openat` kills
/// the process with SIGSYS, at a moment that depends on thread timing. The
/// limit we set is glibc's own default (8 arenas per CPU).
pub fn fix_malloc_arena_limit() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let arenas = libc::c_int::try_from(cpus.saturating_mul(8)).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only sets a malloc tunable; it is called on the main
    // thread before the vCPU and worker threads exist.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
}

/// Syscalls every thread kind makes.
const COMMON: &[libc::c_long] = &[
    libc::SYS_brk,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_close,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_wait,
    libc::SYS_eventfd2,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_fallocate,
    libc::SYS_fcntl,
    libc::SYS_fdatasync,
    libc::SYS_flock,
    libc::SYS_fstat,
    libc::SYS_fsync,
    // qcow2 grows its file ahead of allocating writes (a hole), and cuts
    // the reserve off again on close.
    libc::SYS_ftruncate,
    libc::SYS_futex,
    libc::SYS_getpid,
    libc::SYS_getrandom,
    libc::SYS_gettid,
    // The aio engine (io_setup happens where queues are made; the other
    // three wherever a queue runs or is dropped).
    libc::SYS_io_destroy,
    libc::SYS_io_getevents,
    libc::SYS_io_setup,
    libc::SYS_io_submit,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_lseek,
    libc::SYS_madvise,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_munmap,
    libc::SYS_nanosleep,
    libc::SYS_newfstatat,
    libc::SYS_pread64,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_pwrite64,
    libc::SYS_pwritev,
    libc::SYS_pwritev2,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_recvmsg,
    libc::SYS_restart_syscall,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_yield,
    // vhost-user messages (with fds) to a disk's backend: activation,
    // reset (vCPU) and shutdown (main).
    libc::SYS_sendmsg,
    libc::SYS_sigaltstack,
    libc::SYS_statx,
    libc::SYS_write,
    libc::SYS_writev,
];

/// vCPU threads and the queue workers they spawn.
const VCPU: &[libc::c_long] = &[
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_dup,
    libc::SYS_fcntl,
    libc::SYS_io_uring_setup,
    libc::SYS_prctl,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    // A throttled queue worker's timer, a pinned worker's affinity.
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_sched_setaffinity,
    // The activation thread installs the workers' filters. seccomp(2)
    // can only add restrictions, never lift them.
    libc::SYS_seccomp,
    libc::SYS_set_robust_list,
];

/// Queue workers (and the activation thread that spawns them); `clone`
/// is added with a CLONE_THREAD condition.
const WORKER: &[libc::c_long] = &[
    libc::SYS_clone3,
    libc::SYS_io_uring_setup,
    libc::SYS_prctl,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_set_robust_list,
    // A throttled queue's timer (`virtio-devices` block::rate_limit), a
    // pinned queue's affinity (`queue_affinity`).
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_sched_setaffinity,
];

/// The main thread after set-up (`ioctl` is added with conditions).
const MAIN: &[libc::c_long] = &[
    libc::SYS_tgkill,
    // vm.add-disk opens images (and probes io_uring for engine=auto);
    // vm.disk-info opens backing files read-only.
    libc::SYS_openat,
    libc::SYS_fstatfs,
    // Comparing a hot-added disk's path with the others' (realpath).
    libc::SYS_getcwd,
    libc::SYS_readlink,
    libc::SYS_io_uring_setup,
    // Stopping the API server, removing its socket file.
    libc::SYS_shutdown,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
];

/// `FS_IOC_FIEMAP` (`_IOWR('f', 11, struct fiemap)`).
const FS_IOC_FIEMAP: u64 = 0xC020_660B;

/// Terminal requests the main thread makes when it restores the tty,
/// the KVM VM requests that wire a hot-plugged function, and what
/// opening a hot-added image may ask (a block device's sector size, an
/// image's allocation for `engine=auto`).
const MAIN_IOCTLS: &[u64] = &[
    libc::TCGETS,
    libc::TCSETS,
    hypervisor::ioctls::KVM_IRQFD,
    hypervisor::ioctls::KVM_IOEVENTFD,
    hypervisor::ioctls::KVM_SET_GSI_ROUTING,
    libc::BLKSSZGET,
    FS_IOC_FIEMAP,
];

/// The API server's threads (`clone` is added with a CLONE_THREAD
/// condition).
const API: &[libc::c_long] = &[
    libc::SYS_accept4,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    // Closing a refused connection without a reset.
    libc::SYS_shutdown,
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_set_robust_list,
];

/// `ioctl` allowed only with one of `requests` (argument 1; compared as
/// 32 bits, the width the kernel uses for the request).
fn ioctl_rules(requests: &[u64]) -> Result<(i64, Vec<SeccompRule>), SeccompError> {
    let rules = requests
        .iter()
        .map(|&r| {
            let cond = SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, r)
                .map_err(SeccompError::Build)?;
            SeccompRule::new(vec![cond]).map_err(SeccompError::Build)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((libc::SYS_ioctl, rules))
}

fn allow_list(
    syscalls: &[libc::c_long],
    extra: Vec<(i64, Vec<SeccompRule>)>,
    mismatch: SeccompAction,
) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        syscalls.iter().map(|&nr| (nr, Vec::new())).collect();
    rules.extend(extra);
    let f = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, TargetArch::x86_64)
        .map_err(SeccompError::Build)?;
    BpfProgram::try_from(f).map_err(SeccompError::Compile)
}

/// The BPF programs for `kind`, to be applied in order (empty when
/// seccomp is off).
pub fn filters(kind: ThreadKind, mode: SeccompMode) -> Result<Vec<BpfProgram>, SeccompError> {
    let mismatch = match mode {
        SeccompMode::Off => return Ok(Vec::new()),
        SeccompMode::Enforce => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
    };
    let list = |extra: &[libc::c_long]| -> Vec<libc::c_long> {
        COMMON.iter().chain(extra).copied().collect()
    };
    // Allowed here, failed with EACCES by `fail_with` (see the module docs).
    let list_opening = |extra: &[libc::c_long]| -> Vec<libc::c_long> {
        list(extra)
            .into_iter()
            .chain(OPENING.iter().copied())
            .collect()
    };
    match kind {
        ThreadKind::Main => Ok(vec![allow_list(
            &list(MAIN),
            vec![ioctl_rules(MAIN_IOCTLS)?],
            mismatch,
        )?]),
        ThreadKind::Vcpu => Ok(vec![
            fail_with(OPENING, libc::EACCES)?,
            allow_list(
                &list(VCPU)
                    .into_iter()
                    .chain(OPENING.iter().copied())
                    .collect::<Vec<_>>(),
                vec![ioctl_rules(hypervisor::ioctls::VCPU_THREAD_IOCTLS)?],
                mismatch,
            )?,
        ]),
        ThreadKind::QueueWorker => threads_only(&list_opening(WORKER), mismatch),
        ThreadKind::Api => threads_only(&list_opening(API), mismatch),
    }
}

/// A program under which each of `syscalls` fails with `errno` and
/// everything else passes (to the allow-list installed beside it, which
/// must allow them: the kernel takes the strictest answer of all filters).
fn fail_with(syscalls: &[libc::c_long], errno: i32) -> Result<BpfProgram, SeccompError> {
    let rules = syscalls.iter().map(|&nr| (nr, Vec::new())).collect();
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        TargetArch::x86_64,
    )
    .map_err(SeccompError::Build)?;
    BpfProgram::try_from(f).map_err(SeccompError::Compile)
}

/// File opening in a thread that has no business opening files: allowed
/// by its allow-list, failed with EACCES here (see the module docs).
const OPENING: &[libc::c_long] = &[libc::SYS_openat, libc::SYS_open];

/// `syscalls` plus `clone` for threads only: `clone` is allowed with
/// CLONE_THREAD, and `clone3`, whose flags a filter cannot see, fails
/// with ENOSYS so the C library falls back to `clone`.
fn threads_only(
    syscalls: &[libc::c_long],
    mismatch: SeccompAction,
) -> Result<Vec<BpfProgram>, SeccompError> {
    let thread_only = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
        libc::CLONE_THREAD as u64,
    )
    .map_err(SeccompError::Build)?;
    let clone_rule = SeccompRule::new(vec![thread_only]).map_err(SeccompError::Build)?;
    let allow = allow_list(
        syscalls,
        vec![(libc::SYS_clone, vec![clone_rule])],
        mismatch,
    )?;
    let no_clone3 = fail_with(&[libc::SYS_clone3], libc::ENOSYS)?;
    let no_opening = fail_with(OPENING, libc::EACCES)?;
    // Order matters: the allow-list goes last, as it does not allow
    // seccomp(2) itself.
    Ok(vec![no_clone3, no_opening, allow])
}

/// Installs `kind`'s filters on the calling thread.
pub fn apply(kind: ThreadKind, mode: SeccompMode) -> Result<(), SeccompError> {
    apply_programs(&filters(kind, mode)?)
}

/// Installs already built programs on the calling thread.
pub fn apply_programs(programs: &[BpfProgram]) -> Result<(), SeccompError> {
    for p in programs {
        seccompiler::apply_filter(p).map_err(SeccompError::Apply)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_and_off_means_none() {
        for kind in [
            ThreadKind::Main,
            ThreadKind::Vcpu,
            ThreadKind::QueueWorker,
            ThreadKind::Api,
        ] {
            assert!(!filters(kind, SeccompMode::Enforce).unwrap().is_empty());
            assert!(!filters(kind, SeccompMode::Log).unwrap().is_empty());
            assert!(filters(kind, SeccompMode::Off).unwrap().is_empty());
        }
    }

    /// Forks; the child applies `kind`'s enforced filters and runs
    /// `body`, exiting with what it returns. Returns the wait status.
    fn in_filtered_child(kind: ThreadKind, body: fn() -> i32) -> i32 {
        let progs = filters(kind, SeccompMode::Enforce).unwrap();
        // SAFETY: fork in a test process; the child only makes raw
        // syscalls (prctl and seccomp in apply_filter, which does not
        // allocate on success, ioctl, _exit), so locks held by other
        // threads at fork time do not matter.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = if apply_programs(&progs).is_err() {
                100
            } else {
                body()
            };
            // SAFETY: _exit in the forked child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid status pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    fn killed_by_sigsys(status: i32) -> bool {
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS
    }

    /// An ioctl on stdin with a harmless request the filters do not list.
    fn fionread() -> i32 {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through a valid pointer.
        unsafe { libc::ioctl(0, libc::FIONREAD, &mut n) };
        0
    }

    #[test]
    fn api_filter_blocks_ioctl_and_file_opening() {
        let status = in_filtered_child(ThreadKind::Api, fionread);
        assert!(killed_by_sigsys(status), "status {status:#x}");
        // Opening a file fails with EACCES (the C library opens files on
        // its own and copes; see the module docs).
        for kind in [ThreadKind::Api, ThreadKind::QueueWorker, ThreadKind::Vcpu] {
            let status = in_filtered_child(kind, || {
                // SAFETY: openat with a valid NUL-terminated path.
                let fd = unsafe {
                    libc::openat(libc::AT_FDCWD, c"/etc/hostname".as_ptr(), libc::O_RDONLY)
                };
                let errno = std::io::Error::last_os_error().raw_os_error();
                if fd == -1 && errno == Some(libc::EACCES) {
                    7
                } else {
                    1
                }
            });
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
                "{kind:?}: status {status:#x}"
            );
        }
        // Accepting on a bad fd passes the filter and fails with EBADF.
        let status = in_filtered_child(ThreadKind::Api, || {
            // SAFETY: accept4 on fd -1 with null address pointers only
            // returns EBADF.
            let rc = unsafe { libc::accept4(-1, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
            if rc == -1 {
                7
            } else {
                1
            }
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
            "status {status:#x}"
        );
    }

    #[test]
    fn worker_filter_blocks_every_ioctl() {
        let status = in_filtered_child(ThreadKind::QueueWorker, fionread);
        assert!(killed_by_sigsys(status), "status {status:#x}");
    }

    #[test]
    fn vcpu_filter_allows_kvm_run_but_no_other_ioctl() {
        // KVM_RUN on a bad fd passes the filter and fails with EBADF.
        let status = in_filtered_child(ThreadKind::Vcpu, || {
            // SAFETY: an ioctl on fd -1 only returns EBADF.
            let rc = unsafe { libc::ioctl(-1, hypervisor::ioctls::KVM_RUN as _) };
            let errno = std::io::Error::last_os_error().raw_os_error();
            if rc == -1 && errno == Some(libc::EBADF) {
                7
            } else {
                1
            }
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
            "status {status:#x}"
        );
        let status = in_filtered_child(ThreadKind::Vcpu, fionread);
        assert!(killed_by_sigsys(status), "status {status:#x}");
    }

    #[test]
    fn main_filter_allows_terminal_ioctls_only() {
        let status = in_filtered_child(ThreadKind::Main, || {
            let mut t = std::mem::MaybeUninit::<libc::termios>::zeroed();
            // SAFETY: TCGETS on fd -1 only returns EBADF.
            let rc = unsafe { libc::ioctl(-1, libc::TCGETS, t.as_mut_ptr()) };
            if rc == -1 {
                7
            } else {
                1
            }
        });
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
            "status {status:#x}"
        );
        let status = in_filtered_child(ThreadKind::Main, fionread);
        assert!(killed_by_sigsys(status), "status {status:#x}");
    }
}
