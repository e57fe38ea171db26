//! The report of a system call a thread's filter does not allow.
//!
//! Enforcing filters trap (SECCOMP_RET_TRAP) instead of killing at once:
//! the kernel skips the call and sends the thread SIGSYS with the call's
//! number. The handler [`install`] sets up writes one line on stderr,
//! in the log's format, naming the thread and the call:
//!
//! ```text
//! cloud-hypervisor: ERROR: seccomp: thread 'vcpu0' (tid 4242) made system call socket (41), which its filter does not allow; ending the process
//! ```
//!
//! then ends the process as the filter used to: the kernel has reset
//! SIGSYS to its default action on entry to the handler (SA_RESETHAND),
//! and the handler makes the same call again with the same arguments,
//! which the filter traps again; this time the process dies of SIGSYS
//! (exit status 159 in a shell), as a supervisor saw it before.
//!
//! The handler runs in the middle of whatever the thread was doing, so it
//! does only what is async-signal-safe: no allocation, no lock, no `log`.
//! The line is formatted into a buffer on the stack ([`Report`]) and
//! written with one write(2) to where the log goes (stderr, or the
//! `--log-file`: its descriptor is taken at [`install`]); the thread's name comes from
//! prctl(PR_GET_NAME) and the call's name from the `syscalls` crate's
//! table (a `const` lookup). Every filter allows write, gettid and
//! prctl(PR_GET_NAME).

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

/// Where the report goes (the log's descriptor, set by [`install`]).
static REPORT_FD: AtomicI32 = AtomicI32::new(libc::STDERR_FILENO);

/// The first fields of the kernel's `siginfo_t` for SIGSYS (`_sigsys` in
/// its union, which the `libc` crate does not name).
#[repr(C)]
struct SigsysInfo {
    _signo: libc::c_int,
    _errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    _call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    _arch: libc::c_uint,
}

/// `si_code` of a SIGSYS a seccomp filter sent.
const SYS_SECCOMP: libc::c_int = 1;

/// Longest report line (a thread name is at most 15 bytes).
const REPORT_MAX: usize = 256;

/// One report line, formatted without allocating.
pub struct Report {
    buf: [u8; REPORT_MAX],
    len: usize,
}

impl Report {
    /// The line for thread `thread` (its name as the kernel keeps it, at
    /// most 15 bytes), task `tid`, system call number `nr`.
    pub fn new(thread: &[u8], tid: u64, nr: i64) -> Report {
        let mut r = Report {
            buf: [0; REPORT_MAX],
            len: 0,
        };
        r.push(b"cloud-hypervisor: ERROR: seccomp: thread '");
        r.push(thread);
        r.push(b"' (tid ");
        r.push_number(tid);
        r.push(b") made system call ");
        let name = usize::try_from(nr)
            .ok()
            .and_then(syscalls::Sysno::new)
            .map(|s| s.name());
        match name {
            Some(name) => {
                r.push(name.as_bytes());
                r.push(b" (");
                r.push_number(nr.unsigned_abs());
                r.push(b")");
            }
            None => {
                r.push(b"number ");
                if nr < 0 {
                    r.push(b"-");
                }
                r.push_number(nr.unsigned_abs());
            }
        }
        r.push(b", which its filter does not allow; ending the process\n");
        r
    }

    /// The line's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Appends what fits (the line is cut, never overflows).
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(REPORT_MAX - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn push_number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

/// The calling thread's name as the kernel keeps it (`comm`).
fn thread_name(buf: &mut [u8; 16]) -> &[u8] {
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into
    // the buffer, which has 16.
    let rc = unsafe { libc::prctl(libc::PR_GET_NAME, buf.as_mut_ptr()) };
    if rc != 0 {
        return b"?";
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    &buf[..len]
}

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SIGSYS, whose union
    // holds `_sigsys` (SigsysInfo's layout) when si_code is SYS_SECCOMP.
    let info = unsafe { &*info.cast::<SigsysInfo>() };
    if info.code != SYS_SECCOMP {
        // Sent by someone (kill -SYS): no call to report or to repeat.
        // SAFETY: _exit ends the process without running anything else.
        unsafe { libc::_exit(128 + libc::SIGSYS) };
    }
    let nr = i64::from(info.syscall);
    let mut name = [0u8; 16];
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let report = Report::new(thread_name(&mut name), tid as u64, nr);
    let line = report.as_bytes();
    let fd = REPORT_FD.load(Ordering::Relaxed);
    // SAFETY: writes the line's bytes, which outlive the call, to the
    // log's descriptor, which stays open for the life of the process.
    unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
    // SAFETY: the kernel passes the interrupted thread's ucontext; its
    // general registers hold the trapped call's arguments.
    let regs = unsafe { &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    let arg = |r: libc::c_int| regs[r as usize];
    // SIGSYS is back at its default action (SA_RESETHAND): making the
    // trapped call again, with its own arguments, has the filter trap it
    // again and the kernel end the process with SIGSYS.
    // SAFETY: the filter does not let this call through (it trapped it
    // with these very arguments), so nothing runs.
    unsafe {
        libc::syscall(
            nr,
            arg(libc::REG_RDI),
            arg(libc::REG_RSI),
            arg(libc::REG_RDX),
            arg(libc::REG_R10),
            arg(libc::REG_R8),
            arg(libc::REG_R9),
        )
    };
    // Not reached while the filters trap the call; end the process all
    // the same rather than return to a call that did not run.
    // SAFETY: _exit ends the process without running anything else.
    unsafe { libc::_exit(128 + libc::SIGSYS) };
}

/// Installs the SIGSYS handler for the whole process, reporting where
/// the log goes now. Call it after the log is set up and before any
/// filter is installed.
pub fn install() -> io::Result<()> {
    REPORT_FD.store(ch_log::raw_fd(), Ordering::Relaxed);
    // SAFETY: a zeroed sigaction is a valid starting point; the fields
    // set below make it a SA_SIGINFO handler with an empty mask.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigsys as *const () as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND | libc::SA_ONSTACK;
    // SAFETY: sa_mask is a valid sigset_t owned by `action`.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: installs a handler for SIGSYS from a valid sigaction; the
    // old action is not asked for.
    let rc = unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
