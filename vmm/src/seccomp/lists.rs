//! The system calls each thread kind may make (the allow-lists
//! [`super::filters`] builds its programs from), and the `ioctl` requests
//! some of them may send. Why each kind needs what it has is in
//! [`super`]'s module doc; a call's comment here says why it is there
//! when the kind alone does not.

/// Syscalls every thread kind makes.
pub(super) const COMMON: &[libc::c_long] = &[
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
    // Making a queue's io_uring engine: the file system of each image
    // file says whether its buffered writes are made in the queue's
    // thread (block-engines' uring::inline_writes).
    libc::SYS_fstatfs,
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
pub(super) const VCPU: &[libc::c_long] = &[
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
pub(super) const WORKER: &[libc::c_long] = &[
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
pub(super) const MAIN: &[libc::c_long] = &[
    libc::SYS_tgkill,
    // vm.boot and vm.add-disk open images (and probe io_uring for
    // engine=auto); vm.disk-info opens backing files read-only.
    libc::SYS_openat,
    // Comparing a hot-added disk's path with the others' (realpath).
    libc::SYS_getcwd,
    libc::SYS_readlink,
    libc::SYS_io_uring_setup,
    // Stopping the API server, removing its socket file.
    libc::SYS_shutdown,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    // Checking a disk's queue_affinity against the CPUs this process
    // may use (vm.boot, vm.add-disk).
    libc::SYS_sched_getaffinity,
];

/// `FS_IOC_FIEMAP` (`_IOWR('f', 11, struct fiemap)`).
pub(super) const FS_IOC_FIEMAP: u64 = 0xC020_660B;

/// Terminal requests the main thread makes when it restores the tty,
/// the KVM VM requests that wire a hot-plugged function, and what
/// opening a hot-added image may ask (a block device's sector size, an
/// image's allocation for `engine=auto`).
pub(super) const MAIN_IOCTLS: &[u64] = &[
    libc::TCGETS,
    libc::TCSETS,
    hypervisor::ioctls::KVM_IRQFD,
    hypervisor::ioctls::KVM_IOEVENTFD,
    hypervisor::ioctls::KVM_SET_GSI_ROUTING,
    libc::BLKSSZGET,
    FS_IOC_FIEMAP,
];

/// The `vm-builder` thread (`clone` is added with a CLONE_THREAD
/// condition, `ioctl` with the KVM requests of making a VM): what making
/// a VM needs, and, because the threads it starts inherit this filter
/// under their own, what they need too (the vCPU and worker lists).
pub(super) const BUILDER: &[libc::c_long] = &[
    // /dev/kvm, the kernel and initramfs, the serial port's file.
    libc::SYS_openat,
    // Shared guest RAM (`memory.shared`).
    libc::SYS_memfd_create,
    // Connecting a vhost-user disk's backend.
    libc::SYS_socket,
    libc::SYS_connect,
    // Stopping vCPU threads started before a later one failed.
    libc::SYS_tgkill,
    // Starting threads, and what the started ones do first.
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_set_robust_list,
    libc::SYS_seccomp,
    // The vCPU threads' and queue workers' own lists.
    libc::SYS_dup,
    libc::SYS_io_uring_setup,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_sched_setaffinity,
];

/// The API server's threads (`clone` is added with a CLONE_THREAD
/// condition).
pub(super) const API: &[libc::c_long] = &[
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

/// The NBD connector thread and the connections' reply threads it starts
/// (`clone` is added with a CLONE_THREAD condition, `ioctl` with
/// [`NBD_IOCTLS`]).
pub(super) const NBD: &[libc::c_long] = &[
    // Connecting over Unix or TCP (with a deadline: a non-blocking
    // connect, poll, SO_ERROR), socket options and timeouts, the
    // handshake, replies, the courtesy DISC and shutting a lost link.
    libc::SYS_socket,
    libc::SYS_connect,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_shutdown,
    // Resolving nbd://HOST: the C library's resolver reads /etc/hosts,
    // /etc/resolv.conf and its NSS modules, and asks DNS over UDP.
    libc::SYS_openat,
    libc::SYS_uname,
    libc::SYS_bind,
    libc::SYS_sendmmsg,
    // Starting reply threads.
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_set_robust_list,
];

/// `FIONBIO` (the standard library makes sockets non-blocking with it)
/// and `FIONREAD` (the resolver sizes a UDP answer with it).
pub(super) const NBD_IOCTLS: &[u64] = &[libc::FIONBIO, libc::FIONREAD];

/// The `nbd-export` thread and the accept and connection threads of the
/// exports it starts (`clone` is added with a CLONE_THREAD condition,
/// `ioctl` with [`NBD_EXPORT_IOCTLS`]); docs/nbd.md lists what each of
/// them calls, as strace recorded it.
pub(super) const NBD_EXPORT: &[libc::c_long] = &[
    // Starting an export: the socket, TCP's SO_REUSEADDR, the bound port.
    libc::SYS_socket,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_getsockname,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    // Accepting and serving clients.
    libc::SYS_accept4,
    libc::SYS_getpeername,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_shutdown,
    // Stopping an export: its Unix socket file.
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    // A source whose queues use io_uring.
    libc::SYS_io_uring_setup,
    libc::SYS_dup,
    // Starting the accept and connection threads.
    libc::SYS_clone3,
    libc::SYS_prctl,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_set_robust_list,
];

/// `FIONBIO` (the standard library makes sockets non-blocking with it).
pub(super) const NBD_EXPORT_IOCTLS: &[u64] = &[libc::FIONBIO];
