//! The one `poll(2)` entry the accept thread (`crate::listen`) and
//! every connection thread (`crate::connection`) build their waits
//! from.

/// Waits for `fd` to become readable (a negative `fd` is skipped by
/// `poll`).
pub fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}
