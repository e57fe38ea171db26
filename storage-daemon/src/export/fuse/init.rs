//! FUSE_INIT: the first request of a fresh mount, read and answered on the
//! session's /dev/fuse descriptor before any queue thread starts, so that
//! a kernel that does not offer what was asked (FUSE-over-io_uring) fails
//! the start with the reason instead of a silent fallback.
//!
//! We ask for what qemu-storage-daemon asks (async reads, async direct
//! I/O, big writes), 128 KiB requests (FUSE_MAX_PAGES, 32 pages) and, with
//! `io_uring=on`, FUSE_OVER_IO_URING.

use std::fs::File;
use std::io::Read;

use thiserror::Error;

use super::abi::{init_flags, opcode, InitIn, InitOut, Pod, KERNEL_MINOR_VERSION, KERNEL_VERSION};
use super::devfuse::write_reply;
use super::limits::{DEV_BUFFER_SIZE, MAX_PAGES, MAX_WRITE};
use super::reply::Reply;
use super::request::FuseRequest;

const SYSFS_ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

#[derive(Debug, Error)]
pub enum InitError {
    #[error("reading FUSE_INIT from /dev/fuse failed")]
    Read(#[source] std::io::Error),
    #[error("answering FUSE_INIT failed")]
    Reply(#[source] std::io::Error),
    #[error("the kernel's first request was opcode {0}, not FUSE_INIT")]
    NotInit(u32),
    #[error("the kernel speaks FUSE {0}.{1}; we need 7.x")]
    Version(u32, u32),
    #[error("io_uring=on: {0}")]
    NoUring(String),
}

/// What INIT settled.
#[derive(Clone, Copy, Debug)]
pub struct Negotiated {
    pub io_uring: bool,
}

/// Why the kernel did not offer FUSE-over-io_uring.
fn uring_refusal(minor: u32) -> String {
    if minor < KERNEL_MINOR_VERSION {
        return format!(
            "the kernel speaks FUSE 7.{minor}; FUSE-over-io_uring needs 7.42 (Linux 6.14+)"
        );
    }
    match std::fs::read_to_string(SYSFS_ENABLE_URING) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => {
            "the kernel did not offer FUSE_OVER_IO_URING at FUSE_INIT".into()
        }
        Ok(_) => format!(
            "the kernel did not offer FUSE_OVER_IO_URING: {SYSFS_ENABLE_URING} is off (write 1 to it as root)"
        ),
        Err(_) => format!(
            "the kernel has no FUSE-over-io_uring ({SYSFS_ENABLE_URING} is missing: needs Linux 6.14+ with CONFIG_FUSE_IO_URING)"
        ),
    }
}

/// Our INIT answer to the kernel's offer.
fn answer(init: &InitIn, want_uring: bool) -> Result<InitOut, InitError> {
    let mut offered = u64::from(init.flags);
    if offered & init_flags::INIT_EXT != 0 {
        offered |= u64::from(init.flags2) << 32;
    }
    let mut wanted = init_flags::ASYNC_READ
        | init_flags::BIG_WRITES
        | init_flags::ASYNC_DIO
        | init_flags::MAX_PAGES
        | init_flags::INIT_EXT;
    if want_uring {
        if init.minor < KERNEL_MINOR_VERSION || offered & init_flags::OVER_IO_URING == 0 {
            return Err(InitError::NoUring(uring_refusal(init.minor)));
        }
        wanted |= init_flags::OVER_IO_URING;
    }
    let flags = offered & wanted;
    Ok(InitOut {
        major: KERNEL_VERSION,
        minor: init.minor.min(KERNEL_MINOR_VERSION),
        max_readahead: init.max_readahead,
        flags: flags as u32,
        flags2: (flags >> 32) as u32,
        max_background: u16::MAX,
        congestion_threshold: u16::MAX / 4 * 3,
        max_write: MAX_WRITE,
        time_gran: 1,
        max_pages: MAX_PAGES,
        ..Default::default()
    })
}

/// Reads FUSE_INIT from `session` (blocking) and answers it. On a refusal
/// the kernel gets an error reply (the mount then fails every access)
/// and the caller unmounts.
pub fn negotiate(session: &File, want_uring: bool) -> Result<Negotiated, InitError> {
    let mut buf = vec![0u8; DEV_BUFFER_SIZE];
    let n = loop {
        match (&*session).read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(InitError::Read(e)),
        }
    };
    let req = FuseRequest::from_dev_buffer(&buf[..n])
        .map_err(|_| InitError::Read(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    if req.header.opcode != opcode::INIT {
        let _ = write_reply(session, req.header.unique, &Reply::Error(libc::EIO));
        return Err(InitError::NotInit(req.header.opcode));
    }
    let init = InitIn::read_from(req.arg).unwrap_or_default();
    if init.major != KERNEL_VERSION {
        let _ = write_reply(session, req.header.unique, &Reply::Error(libc::EPROTO));
        return Err(InitError::Version(init.major, init.minor));
    }
    match answer(&init, want_uring) {
        Ok(out) => {
            write_reply(
                session,
                req.header.unique,
                &Reply::Body(out.as_bytes().to_vec()),
            )
            .map_err(InitError::Reply)?;
            Ok(Negotiated {
                io_uring: u64::from(out.flags2) << 32 & init_flags::OVER_IO_URING != 0,
            })
        }
        Err(e) => {
            let _ = write_reply(session, req.header.unique, &Reply::Error(libc::ENODEV));
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(flags: u64, minor: u32) -> InitIn {
        InitIn {
            major: 7,
            minor,
            max_readahead: 65536,
            flags: flags as u32,
            flags2: (flags >> 32) as u32,
            ..Default::default()
        }
    }

    #[test]
    fn takes_only_what_the_kernel_offers() {
        let all = u64::MAX;
        let out = answer(&offer(all, 44), false).unwrap();
        assert_eq!(out.minor, 42);
        let got = u64::from(out.flags) | u64::from(out.flags2) << 32;
        assert_ne!(got & init_flags::ASYNC_DIO, 0);
        assert_eq!(got & init_flags::OVER_IO_URING, 0);
        assert_eq!(out.max_write, MAX_WRITE);
        let out = answer(&offer(init_flags::ASYNC_READ, 31), false).unwrap();
        assert_eq!((out.flags, out.flags2, out.minor), (1, 0, 31));
    }

    #[test]
    fn io_uring_needs_the_kernels_offer() {
        let no_uring = !init_flags::OVER_IO_URING;
        let e = answer(&offer(no_uring, 44), true).unwrap_err().to_string();
        assert!(e.contains("FUSE_OVER_IO_URING"), "{e}");
        let e = answer(&offer(u64::MAX, 41), true).unwrap_err().to_string();
        assert!(e.contains("7.42"), "{e}");
        let out = answer(&offer(u64::MAX, 44), true).unwrap();
        assert_ne!(u64::from(out.flags2) << 32 & init_flags::OVER_IO_URING, 0);
    }
}
