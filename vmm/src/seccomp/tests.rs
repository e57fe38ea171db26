//! The filters against the kernel: a forked child installs one and
//! makes the calls (the parent only waits), so a trapped call ends the
//! child, not the test run.

use super::*;

#[test]
fn filters_compile_and_off_means_none() {
    for kind in [
        ThreadKind::Main,
        ThreadKind::Vcpu,
        ThreadKind::QueueWorker,
        ThreadKind::Api,
        ThreadKind::Nbd,
        ThreadKind::NbdExport,
        ThreadKind::BlockJob,
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
            let fd =
                unsafe { libc::openat(libc::AT_FDCWD, c"/etc/hostname".as_ptr(), libc::O_RDONLY) };
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

/// Forks; the child sends its stderr into a pipe, installs the SIGSYS
/// report and `kind`'s enforced filters, and runs `body`. Returns the
/// wait status and what the child wrote on stderr.
fn reported_child(kind: ThreadKind, body: fn() -> i32) -> (i32, String) {
    use std::io::Read;
    use std::os::fd::FromRawFd;

    let progs = filters(kind, SeccompMode::Enforce).unwrap();
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds into a valid array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: as in `in_filtered_child`; dup2, sigaction, prctl and
    // seccomp are raw syscalls that do not allocate.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the pipe's write end becomes this child's stderr.
        unsafe { libc::dup2(fds[1], libc::STDERR_FILENO) };
        let code = if sigsys::install().is_err() || apply_programs(&progs).is_err() {
            100
        } else {
            body()
        };
        // SAFETY: _exit in the forked child.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: the write end is ours to close; the read end becomes a File
    // that owns it.
    let mut out = unsafe {
        libc::close(fds[1]);
        std::fs::File::from_raw_fd(fds[0])
    };
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    (status, text)
}

/// A Unix stream socket (closed again); 7 when it was made.
fn make_socket() -> i32 {
    // SAFETY: socket(2) with constant arguments; the fd is closed.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return 1;
    }
    // SAFETY: closing the fd just made.
    unsafe { libc::close(fd) };
    7
}

#[test]
fn a_trapped_call_is_reported_with_the_thread_and_the_call() {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    let len = name.iter().position(|&b| b == 0).unwrap_or(16);
    let thread = String::from_utf8_lossy(&name[..len]).into_owned();
    for (kind, body, call) in [
        (ThreadKind::Main, make_socket as fn() -> i32, "socket (41)"),
        (ThreadKind::Main, fionread, "ioctl (16)"),
        (ThreadKind::QueueWorker, make_socket, "socket (41)"),
        (ThreadKind::Api, fionread, "ioctl (16)"),
        (ThreadKind::Vcpu, make_socket, "socket (41)"),
    ] {
        let (status, err) = reported_child(kind, body);
        // The process still dies of SIGSYS, as the filter's kill did.
        assert!(
            killed_by_sigsys(status),
            "{kind:?}: status {status:#x}: {err}"
        );
        let want = format!("cloud-hypervisor: ERROR: seccomp: thread '{thread}' (tid ");
        assert!(err.starts_with(&want), "{kind:?}: {err}");
        assert!(
            err.contains(&format!(
                ") made system call {call}, which its filter does not allow; ending the process\n"
            )),
            "{kind:?}: {err}"
        );
    }
}

#[test]
fn only_the_nbd_thread_makes_sockets() {
    let (status, err) = reported_child(ThreadKind::Nbd, make_socket);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
        "status {status:#x}: {err}"
    );
    // Its ioctls are the two socket requests only.
    let (status, err) = reported_child(ThreadKind::Nbd, || {
        let mut t = std::mem::MaybeUninit::<libc::termios>::zeroed();
        // SAFETY: TCGETS on fd -1 only returns EBADF (if let through).
        unsafe { libc::ioctl(-1, libc::TCGETS, t.as_mut_ptr()) };
        0
    });
    assert!(killed_by_sigsys(status), "status {status:#x}: {err}");
    assert!(err.contains("made system call ioctl (16)"), "{err}");
}

#[test]
fn report_lines_name_the_call_or_give_its_number() {
    let r = sigsys::Report::new(b"vcpu0", 4242, libc::SYS_socket);
    assert_eq!(
        std::str::from_utf8(r.as_bytes()).unwrap(),
        "cloud-hypervisor: ERROR: seccomp: thread 'vcpu0' (tid 4242) made system call \
         socket (41), which its filter does not allow; ending the process\n"
    );
    let r = sigsys::Report::new(b"api", 7, 100_000);
    assert!(std::str::from_utf8(r.as_bytes())
        .unwrap()
        .contains("thread 'api' (tid 7) made system call number 100000, which"));
    let r = sigsys::Report::new(b"x", 0, -3);
    assert!(std::str::from_utf8(r.as_bytes())
        .unwrap()
        .contains("(tid 0) made system call number -3, which"));
    // A name that would not fit is cut, never overflows.
    let long = [b'n'; 400];
    let r = sigsys::Report::new(&long, u64::MAX, 1);
    assert_eq!(r.as_bytes().len(), 256);
}

/// A Unix socket bound to an abstract name (no file) and listened on:
/// 7 when every call succeeded.
fn listen_abstract() -> i32 {
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return 1;
    }
    // SAFETY: an all-zero sockaddr_un is valid; an abstract name starts
    // with a NUL byte.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("ch-seccomp-test-{}", std::process::id());
    for (i, b) in name.bytes().enumerate() {
        addr.sun_path[i + 1] = b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
    // SAFETY: bind and listen on the fd just made, with a valid address
    // of `len` bytes.
    let ok = unsafe {
        libc::bind(fd, std::ptr::addr_of!(addr).cast(), len) == 0 && libc::listen(fd, 4) == 0
    };
    // SAFETY: closing the fd just made.
    unsafe { libc::close(fd) };
    if ok {
        7
    } else {
        2
    }
}

#[test]
fn the_export_thread_listens_but_neither_connects_nor_opens_files() {
    let (status, err) = reported_child(ThreadKind::NbdExport, listen_abstract);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
        "status {status:#x}: {err}"
    );
    let (status, err) = reported_child(ThreadKind::NbdExport, || {
        // SAFETY: connect on fd -1 with a null address: EBADF if let
        // through.
        unsafe { libc::connect(-1, std::ptr::null(), 0) };
        0
    });
    assert!(killed_by_sigsys(status), "status {status:#x}: {err}");
    assert!(err.contains("made system call connect (42)"), "{err}");
    let status = in_filtered_child(ThreadKind::NbdExport, || {
        // SAFETY: openat with a valid NUL-terminated path.
        let fd = unsafe { libc::openat(libc::AT_FDCWD, c"/etc/hostname".as_ptr(), libc::O_RDONLY) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if fd < 0 && errno == Some(libc::EACCES) {
            7
        } else {
            3
        }
    });
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
        "status {status:#x}"
    );
}
