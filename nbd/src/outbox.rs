//! The send queue of one connection: owned buffers, sent in order with
//! `sendmsg` (many buffers per call) without ever blocking.
//!
//! Small pieces (headers) are appended into shared buffers; large ones
//! (read data, write payloads) are queued as they are, so their bytes are
//! not copied again. [`Outbox::flush`] writes until the queue is empty or
//! the socket is full (`EAGAIN`); the caller then waits for the socket to
//! become writable and flushes again. Buffers leave the queue once every
//! byte of them has been sent, so nothing the kernel still reads from is
//! ever freed: `sendmsg` copies before it returns.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Pieces shorter than this are copied into a shared buffer.
const SMALL: usize = 4096;
/// A shared buffer stops taking pieces at this size.
const SMALL_BUF_CAP: usize = 64 << 10;
/// Buffers handed to one `sendmsg`.
const IOVECS_PER_CALL: usize = 64;

#[derive(Default)]
pub struct Outbox {
    /// Buffers in send order, each with whether it takes more small pieces.
    bufs: VecDeque<(Vec<u8>, bool)>,
    /// Bytes of the front buffer already sent.
    sent: usize,
    /// Bytes queued and not sent.
    pending: usize,
    /// Emptied shared buffers, reused.
    spare: Vec<Vec<u8>>,
}

/// What [`Outbox::flush`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flushed {
    /// Everything queued has been sent.
    All,
    /// The socket is full; wait for it to become writable.
    Blocked,
}

impl Outbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a copy of `bytes` (or the bytes themselves when large).
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        if bytes.len() >= SMALL {
            self.push_owned(bytes.to_vec());
            return;
        }
        self.small_buf(bytes.len()).extend_from_slice(bytes);
        self.pending += bytes.len();
    }

    /// Queues `buf` without copying it.
    pub fn push_owned(&mut self, buf: Vec<u8>) {
        if buf.is_empty() {
            return;
        }
        if buf.len() < SMALL {
            self.push_bytes(&buf);
            return;
        }
        self.pending += buf.len();
        self.bufs.push_back((buf, false));
    }

    /// Queues whatever `encode` appends (headers are encoded in place).
    pub fn push_with(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        let buf = self.small_buf(64);
        let before = buf.len();
        encode(buf);
        let added = buf.len() - before;
        self.pending += added;
    }

    fn small_buf(&mut self, room: usize) -> &mut Vec<u8> {
        let reuse = matches!(self.bufs.back(), Some((b, true)) if b.len() + room <= SMALL_BUF_CAP);
        if !reuse {
            let fresh = self.spare.pop().unwrap_or_default();
            self.bufs.push_back((fresh, true));
        }
        // The branch above guarantees a back buffer.
        &mut self.bufs.back_mut().expect("a back buffer").0
    }

    /// Bytes queued and not yet sent.
    pub fn pending(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Drops everything queued (the connection is gone).
    pub fn clear(&mut self) {
        self.bufs.clear();
        self.sent = 0;
        self.pending = 0;
    }

    /// Sends as much as the socket takes now.
    pub fn flush(&mut self, fd: BorrowedFd<'_>) -> io::Result<Flushed> {
        while self.pending > 0 {
            let mut iov: [libc::iovec; IOVECS_PER_CALL] = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; IOVECS_PER_CALL];
            let mut n = 0;
            for (i, (buf, _)) in self.bufs.iter().enumerate().take(IOVECS_PER_CALL) {
                let start = if i == 0 { self.sent } else { 0 };
                let part = &buf[start..];
                iov[n] = libc::iovec {
                    iov_base: part.as_ptr() as *mut libc::c_void,
                    iov_len: part.len(),
                };
                n += 1;
            }
            // SAFETY: an all-zero msghdr is valid; it points at `iov`,
            // whose first `n` entries name live slices of `self.bufs`,
            // which nothing changes during the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = n;
            // SAFETY: `msg` is valid as above; sendmsg only reads the
            // buffers it names.
            let r = unsafe {
                libc::sendmsg(
                    fd.as_raw_fd(),
                    &msg,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(Flushed::Blocked),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            self.consume(r as usize);
        }
        Ok(Flushed::All)
    }

    /// Forgets the first `n` bytes (they have been sent).
    fn consume(&mut self, mut n: usize) {
        self.pending -= n;
        while n > 0 {
            let Some((front, _)) = self.bufs.front() else {
                break;
            };
            let left = front.len() - self.sent;
            if n < left {
                self.sent += n;
                return;
            }
            n -= left;
            self.sent = 0;
            if let Some((mut buf, small)) = self.bufs.pop_front() {
                if small && self.spare.len() < 4 {
                    buf.clear();
                    self.spare.push(buf);
                }
            }
        }
        if self.pending == 0 {
            // A fully sent shared buffer at the back stays for reuse.
            self.sent = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn sends_everything_in_order_and_stops_when_the_socket_is_full() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut out = Outbox::new();
        let mut expect = Vec::new();
        for i in 0..200u32 {
            out.push_bytes(&i.to_be_bytes());
            expect.extend_from_slice(&i.to_be_bytes());
            let big = vec![i as u8; 10_000];
            expect.extend_from_slice(&big);
            out.push_owned(big);
            out.push_with(|b| b.extend_from_slice(b"hdr"));
            expect.extend_from_slice(b"hdr");
        }
        assert_eq!(out.pending(), expect.len());
        // 2 MB does not fit a socket buffer: the flush stops, never blocks.
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let f = out.flush(a.as_fd()).unwrap();
            b.set_nonblocking(true).unwrap();
            while let Ok(n) = b.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            if f == Flushed::All {
                break;
            }
        }
        b.set_nonblocking(false).unwrap();
        assert!(out.is_empty());
        while got.len() < expect.len() {
            let n = b.read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, expect);
    }

    #[test]
    fn a_closed_peer_is_an_error_not_a_signal() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let mut out = Outbox::new();
        out.push_bytes(b"x");
        assert!(out.flush(a.as_fd()).is_err());
    }
}
