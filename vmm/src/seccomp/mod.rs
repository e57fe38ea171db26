//! seccomp-bpf allow-lists per thread kind, built with seccompiler (the
//! lists themselves are in [`lists`]).
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
//!   down and taking them out of a VM for a reboot (joining workers,
//!   flushing, closing, dropping the VM), and what API requests need:
//!   opening a boot's disks and a hot-added image (and reading a backing
//!   chain's headers), resizing and snapshotting images, wiring a
//!   hot-added function into KVM; `ioctl` only for TCGETS/TCSETS (the
//!   terminal, raw while a VM owns it) and the KVM VM requests of
//!   hotplug (irqfd, ioeventfd, GSI routing). No sockets, no thread
//!   creation, no VM creation (the builder's, below).
//! - [`ThreadKind::Api`]: the API server: accepting on its socket,
//!   reading and writing connections with timeouts, starting a thread
//!   per connection (`clone` with CLONE_THREAD only, as for workers), and
//!   waking the control loop (an eventfd write). No file opening, no
//!   ioctl, no image I/O.
//! - [`ThreadKind::Nbd`]: the NBD client's connector thread
//!   (`block::engines::nbd::start_connector`) and the reply threads of the
//!   connections it opens: creating and connecting sockets (Unix and
//!   TCP, with name resolution, so `openat` for the resolver's files),
//!   the handshake, receiving replies, reconnecting, starting threads
//!   (CLONE_THREAD only); `ioctl` only for FIONBIO and FIONREAD.
//! - [`ThreadKind::NbdExport`]: the `nbd-export` thread
//!   ([`crate::nbd_exports`]) that starts and stops the VMM's NBD
//!   exports (backups' point-in-time views), and the accept and
//!   connection threads the server starts (they inherit its filter):
//!   making, binding and listening on sockets, accepting, the protocol's
//!   reads and writes, the view's reads of the disk and the scratch
//!   image (preadv/pwritev, eventfds), removing a Unix socket file,
//!   starting threads (CLONE_THREAD only); `ioctl` only for FIONBIO.
//!   No `connect`, no file opening (EACCES), so no host name is
//!   resolved: a TCP address is given as numbers.
//! - [`ThreadKind::Builder`]: the `vm-builder` thread
//!   ([`crate::vm_builder`]), where every VM is made, at the first boot
//!   and at each `vm.boot` and reboot after it: opening `/dev/kvm`, the
//!   kernel, initramfs and serial file (`openat`), `memfd_create` for
//!   shared guest RAM, `socket`/`connect` to a vhost-user backend,
//!   starting threads (CLONE_THREAD only), and `ioctl` only with the KVM
//!   requests of making a VM and its vCPUs
//!   (`hypervisor::ioctls::BUILD_IOCTLS`, measured with strace: exactly
//!   those a boot sends) and of running it. The threads it starts (vCPUs,
//!   their activation threads and queue workers, the serial input)
//!   inherit this filter and install their own on top, so the list also
//!   holds what they need (`seccomp`, `io_uring_setup`, `dup`, the
//!   timers and affinity calls of the worker list); the kernel applies
//!   the strictest answer of all of a thread's filters.
//! - [`ThreadKind::BlockJob`]: a block job's thread (`vm.disk-mirror`,
//!   `vm.disk-stream`, `vm.disk-commit`):
//!   I/O on the job's own queues (every engine, as a queue worker; the
//!   threads engine's pool starts from it), nothing else: the job's
//!   queues and target are made, and a target it made is removed, on the
//!   control loop. The loop may not start threads, so a job's thread is
//!   started on the `vm-builder` thread and installs this list on top of
//!   the builder's before it does any work.
//! - [`ThreadKind::EventMonitor`]: the `event-monitor` thread
//!   ([`crate::events`]): writing queued events to its file, nothing
//!   else (the common list; file opening fails with EACCES).
//!
//! Where VMs are made: on the `vm-builder` thread, not on the control
//! loop. Making a VM needs what the loop's filter withholds (KVM's VM
//! and vCPU creation, guest RAM mappings from a memfd, starting threads,
//! a vhost-user socket); widening the main filter for it would hand
//! those to the thread that also parses every API request and opens
//! hot-added images. The builder is started before any filter exists,
//! installs its own, and only runs jobs the loop sends it
//! (`VmBuilder::run`); the loop opens a boot's disks itself (what its
//! filter allows for hot-add) and hands them over. The command line's VM
//! is built the same way, after the main filter is on, so every test
//! run exercises the path `vm.boot` takes.
//!
//! Where sockets are made: only in [`ThreadKind::Nbd`] threads (the
//! client side) and [`ThreadKind::NbdExport`] threads (the exports). Every NBD
//! connection of the process is opened on the one connector thread, which
//! the VMM starts before any filter exists: a boot disk's, a hot-added
//! disk's first connection (`vm.add-disk` runs on the control loop), a
//! backing export `vm.disk-info` reads, a queue's own connection
//! (multi-conn; queues are made on a vCPU's activation thread), and every
//! reconnection (a connection's reply thread starts on the connector and
//! inherits its filter). The other kinds only send and receive on sockets
//! they are given (`sendmsg`, `recvmsg`), which their filters allow. So
//! the control loop, which also opens image files and wires KVM, gets no
//! network calls, and the one kind that has them has no KVM or image
//! tools; giving the control loop `socket` and `connect` instead would
//! also have left the reply threads of hot-added disks under a filter
//! without `poll` or `recvfrom`.
//!
//! Enforce mode traps anything else: the thread gets SIGSYS, whose
//! handler ([`sigsys`]) logs the thread and the call, then ends the
//! process with SIGSYS as a kill would have. Log mode allows it but has
//! the kernel log it (audit). Every thread has a filter from its start
//! (the builder, the connector and the event monitor) or from before it
//! does any work (the main thread installs its own before it opens the
//! command line's disks).
//!
//! Opening a file (`openat`, `open`) in a vCPU, queue-worker or API
//! thread fails with EACCES instead of ending the process: no file is
//! opened either way, but the C library opens files lazily on its own
//! (glibc's malloc reads /proc/sys/vm/overcommit_memory the first time it
//! shrinks a thread's heap, at a moment that depends on what was freed),
//! and it copes with the failure.

mod lists;
pub mod sigsys;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use lists::{
    API, BUILDER, COMMON, MAIN, MAIN_IOCTLS, NBD, NBD_EXPORT, NBD_EXPORT_IOCTLS, NBD_IOCTLS, VCPU,
    WORKER,
};
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
    Nbd,
    NbdExport,
    Builder,
    EventMonitor,
    BlockJob,
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
/// /sys/devices/system/cpu/online; under our filters that `openat` ends
/// the process with SIGSYS, at a moment that depends on thread timing. The
/// limit we set is glibc's own default (8 arenas per CPU).
pub fn fix_malloc_arena_limit() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let arenas = libc::c_int::try_from(cpus.saturating_mul(8)).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only sets a malloc tunable; it is called on the main
    // thread before the vCPU and worker threads exist.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
}

/// `ioctl` allowed only with one of `requests` (argument 1; compared as
/// 32 bits, the width the kernel uses for the request).
fn ioctl_rules(requests: &[u64]) -> Result<(i64, Vec<SeccompRule>), SeccompError> {
    arg_rules(libc::SYS_ioctl, 1, SeccompCmpArgLen::Dword, requests)
}

/// `nr` allowed only where argument `arg` is one of `values`.
fn arg_rules(
    nr: libc::c_long,
    arg: u8,
    len: SeccompCmpArgLen,
    values: &[u64],
) -> Result<(i64, Vec<SeccompRule>), SeccompError> {
    let rules = values
        .iter()
        .map(|&v| {
            let cond = SeccompCondition::new(arg, len.clone(), SeccompCmpOp::Eq, v)
                .map_err(SeccompError::Build)?;
            SeccompRule::new(vec![cond]).map_err(SeccompError::Build)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((nr, rules))
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
        SeccompMode::Enforce => SeccompAction::Trap,
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
            vec![
                ioctl_rules(MAIN_IOCTLS)?,
                // The SIGSYS report names the thread (the other kinds
                // allow prctl for naming the threads they start).
                arg_rules(
                    libc::SYS_prctl,
                    0,
                    SeccompCmpArgLen::Dword,
                    &[libc::PR_GET_NAME as u64],
                )?,
            ],
            mismatch,
        )?]),
        ThreadKind::Vcpu => Ok(vec![
            fail_with(OPENING, libc::EACCES)?,
            allow_list(
                &list_opening(VCPU),
                vec![ioctl_rules(hypervisor::ioctls::VCPU_THREAD_IOCTLS)?],
                mismatch,
            )?,
        ]),
        ThreadKind::QueueWorker | ThreadKind::BlockJob => {
            threads_only(&list_opening(WORKER), Vec::new(), true, mismatch)
        }
        ThreadKind::Api => threads_only(&list_opening(API), Vec::new(), true, mismatch),
        ThreadKind::Nbd => {
            threads_only(&list(NBD), vec![ioctl_rules(NBD_IOCTLS)?], false, mismatch)
        }
        ThreadKind::NbdExport => threads_only(
            &list_opening(NBD_EXPORT),
            vec![ioctl_rules(NBD_EXPORT_IOCTLS)?],
            true,
            mismatch,
        ),
        ThreadKind::Builder => threads_only(
            &list(BUILDER),
            vec![ioctl_rules(&builder_ioctls())?],
            false,
            mismatch,
        ),
        ThreadKind::EventMonitor => Ok(vec![
            fail_with(OPENING, libc::EACCES)?,
            allow_list(&list_opening(&[]), Vec::new(), mismatch)?,
        ]),
    }
}

/// What the `vm-builder` thread may send `ioctl`: making a VM and its
/// vCPUs, and what the vCPU threads it starts send.
fn builder_ioctls() -> Vec<u64> {
    hypervisor::ioctls::BUILD_IOCTLS
        .iter()
        .chain(hypervisor::ioctls::VCPU_THREAD_IOCTLS)
        .copied()
        .collect()
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

/// `syscalls` and `extra` plus `clone` for threads only: `clone` is
/// allowed with CLONE_THREAD, and `clone3`, whose flags a filter cannot
/// see, fails with ENOSYS so the C library falls back to `clone`. With
/// `no_opening`, file opening fails with EACCES.
fn threads_only(
    syscalls: &[libc::c_long],
    mut extra: Vec<(i64, Vec<SeccompRule>)>,
    no_opening: bool,
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
    extra.push((libc::SYS_clone, vec![clone_rule]));
    let allow = allow_list(syscalls, extra, mismatch)?;
    let mut programs = vec![fail_with(&[libc::SYS_clone3], libc::ENOSYS)?];
    if no_opening {
        programs.push(fail_with(OPENING, libc::EACCES)?);
    }
    // Order matters: the allow-list goes last, as it does not allow
    // seccomp(2) itself.
    programs.push(allow);
    Ok(programs)
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
