//! The API's listening socket: created at `path=` with owner-only
//! permissions (0600), or taken over from `fd=`.
//!
//! A path that exists is refused unless it is a socket nobody listens
//! on any more (left by a VMM that died), which is replaced. The socket
//! is bound under a umask of 0177, so it is never reachable by others,
//! not even for a moment, and chmod'ed to 0600 after.

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use thiserror::Error;

use crate::config::ApiSocketConfig;

#[derive(Debug, Error)]
pub enum SocketError {
    #[error("{0} exists and is not a socket")]
    NotASocket(String),
    #[error("{0} is in use by a running server")]
    InUse(String),
    #[error("cannot remove the stale socket {path}")]
    RemoveStale {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot create the API socket {path}")]
    Bind {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot make {path} owner-only")]
    Chmod {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("fd {fd} is not a listening Unix stream socket")]
    BadFd {
        fd: RawFd,
        #[source]
        source: io::Error,
    },
}

/// Opens the listener `cfg` names.
pub fn listen(cfg: &ApiSocketConfig) -> Result<UnixListener, SocketError> {
    match cfg {
        ApiSocketConfig::Path(p) => listen_at(p),
        ApiSocketConfig::Fd(fd) => from_fd(*fd),
    }
}

fn listen_at(path: &Path) -> Result<UnixListener, SocketError> {
    let shown = path.display().to_string();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(SocketError::NotASocket(shown));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(SocketError::InUse(shown));
        }
        std::fs::remove_file(path).map_err(|source| SocketError::RemoveStale {
            path: shown.clone(),
            source,
        })?;
    }
    // SAFETY: umask only changes the process's file creation mask; the
    // old one is put back right after the bind.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound.map_err(|source| SocketError::Bind {
        path: shown.clone(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        SocketError::Chmod {
            path: shown,
            source,
        }
    })?;
    Ok(listener)
}

fn from_fd(fd: RawFd) -> Result<UnixListener, SocketError> {
    let bad = |source| SocketError::BadFd { fd, source };
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one int into `kind` and its length into
    // `len`, both valid for writes; a bad fd only fails.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut kind as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(bad(io::Error::last_os_error()));
    }
    if kind == 0 {
        return Err(bad(io::Error::other("the socket is not listening")));
    }
    // SAFETY: checked above that `fd` is an open, listening socket; the
    // caller gave it to us with --api-socket fd=N, so we own it now.
    let listener = unsafe { UnixListener::from_raw_fd(fd) };
    match listener.local_addr() {
        Ok(_) => Ok(listener),
        Err(e) => {
            // Not a Unix socket: hand the descriptor back untouched.
            std::mem::forget(listener);
            Err(bad(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("api-sock-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn owner_only_and_stale_sockets_replaced() {
        let d = dir("perm");
        let p = d.join("s");
        let l = listen(&ApiSocketConfig::Path(p.clone())).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A live one is refused, a dead one replaced.
        let e = listen(&ApiSocketConfig::Path(p.clone())).unwrap_err();
        assert!(matches!(e, SocketError::InUse(_)), "{e}");
        drop(l);
        let _l = listen(&ApiSocketConfig::Path(p.clone())).unwrap();
        std::fs::write(d.join("f"), b"x").unwrap();
        let e = listen(&ApiSocketConfig::Path(d.join("f"))).unwrap_err();
        assert!(matches!(e, SocketError::NotASocket(_)), "{e}");
        let e = listen(&ApiSocketConfig::Path(d.join("no/such/dir"))).unwrap_err();
        assert!(matches!(e, SocketError::Bind { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn inherited_fds_must_be_listening_unix_sockets() {
        let d = dir("fd");
        let l = UnixListener::bind(d.join("s")).unwrap();
        let fd = l.into_raw_fd();
        assert!(listen(&ApiSocketConfig::Fd(fd)).is_ok());
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let e = listen(&ApiSocketConfig::Fd(file.into_raw_fd())).unwrap_err();
        assert!(matches!(e, SocketError::BadFd { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
