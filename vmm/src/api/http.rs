//! One HTTP/1.1 exchange on a stream: read a request (httparse parses
//! the head; the body is read by its Content-Length), write a response,
//! close. httparse is hyper's parser: zero-copy, no allocation, and it
//! leaves the I/O to us, which is what lets every read here have a
//! deadline and a size limit (a full server crate such as tiny_http
//! spawns threads and reads without either; hyper needs an async
//! runtime). Keep-alive is not offered: each response says
//! `Connection: close`. Responses are written in Cloud Hypervisor's form
//! ([`write_response`]), so its own client reads them.
//!
//! Limits: the head within [`MAX_HEAD`] bytes, the body within
//! [`MAX_BODY`], the whole request within [`REQUEST_DEADLINE`]. A client
//! that breaks one gets the matching status and the connection closes.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Request line and headers.
pub const MAX_HEAD: usize = 16 << 10;
/// Request body.
pub const MAX_BODY: usize = 64 << 10;
/// The whole request must arrive within this.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
const MAX_HEADERS: usize = 32;
/// The `Server` header, Cloud Hypervisor's.
pub const SERVER: &str = "Cloud Hypervisor API";

/// A request that arrived whole.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The target without its query string.
    pub path: String,
    pub body: Vec<u8>,
}

/// Why no request could be read; `status` says what to answer (`None`:
/// the client left, answer nothing).
#[derive(Debug, PartialEq, Eq)]
pub struct ReadError {
    pub status: Option<u16>,
    pub message: String,
}

fn fail(status: u16, message: impl Into<String>) -> ReadError {
    ReadError {
        status: Some(status),
        message: message.into(),
    }
}

/// Something a request can be read from with a per-read timeout (a Unix
/// stream; a byte slice in tests).
pub trait Stream: Read + Write {
    /// Bounds the next read to `timeout`.
    fn set_read_deadline(&mut self, timeout: Duration) -> std::io::Result<()>;
}

impl Stream for std::os::unix::net::UnixStream {
    fn set_read_deadline(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
    }
}

/// Reads one request from `s`.
pub fn read_request(s: &mut impl Stream) -> Result<Request, ReadError> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf = Vec::with_capacity(1024);
    let (method, path, head_len, body_len, expect_continue) = loop {
        if let Some(head) = parse_head(&buf)? {
            break head;
        }
        if buf.len() >= MAX_HEAD {
            return Err(fail(431, format!("request head over {MAX_HEAD} bytes")));
        }
        read_more(s, &mut buf, MAX_HEAD, deadline)?;
    };
    if body_len > MAX_BODY {
        return Err(fail(
            413,
            format!("request body of {body_len} bytes, the limit is {MAX_BODY}"),
        ));
    }
    if expect_continue && buf.len() < head_len + body_len {
        write_all(s, b"HTTP/1.1 100 Continue\r\n\r\n")
            .map_err(|e| fail(400, format!("cannot answer Expect: {e}")))?;
    }
    let want = head_len + body_len;
    while buf.len() < want {
        read_more(s, &mut buf, want, deadline)?;
    }
    let body = buf[head_len..want].to_vec();
    Ok(Request { method, path, body })
}

type Head = (String, String, usize, usize, bool);

/// The request head if `buf` holds all of it: method, path, head length,
/// body length, whether the client waits for `100 Continue`.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ReadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(fail(431, format!("more than {MAX_HEADERS} headers")))
        }
        Err(e) => return Err(fail(400, format!("malformed HTTP request: {e}"))),
    };
    if req.version != Some(1) {
        return Err(fail(505, "only HTTP/1.1 is served"));
    }
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_string();
    let mut body_len = 0usize;
    let mut expect_continue = false;
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            body_len = value
                .parse()
                .map_err(|_| fail(400, format!("bad Content-Length '{value}'")))?;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(fail(
                411,
                "chunked bodies are not accepted: send a Content-Length",
            ));
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect_continue = value.eq_ignore_ascii_case("100-continue");
        }
    }
    Ok(Some((method, path, head_len, body_len, expect_continue)))
}

/// Reads what has arrived (at most up to `limit` bytes in `buf`).
fn read_more(
    s: &mut impl Stream,
    buf: &mut Vec<u8>,
    limit: usize,
    deadline: Instant,
) -> Result<(), ReadError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(fail(408, "the request did not arrive in time"));
    }
    s.set_read_deadline(left)
        .map_err(|e| fail(500, format!("cannot set a read timeout: {e}")))?;
    let mut chunk = [0u8; 4096];
    let room = (limit - buf.len()).min(chunk.len());
    match s.read(&mut chunk[..room]) {
        Ok(0) => Err(ReadError {
            status: None,
            message: "the client closed the connection mid-request".into(),
        }),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(fail(408, "the request did not arrive in time"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(()),
        Err(e) => Err(ReadError {
            status: None,
            message: format!("read failed: {e}"),
        }),
    }
}

fn write_all(s: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    s.write_all(bytes)?;
    s.flush()
}

/// Writes a whole response as Cloud Hypervisor's server writes it: the
/// status line without a reason phrase (`HTTP/1.1 200 `, which its
/// client needs: it parses everything after the version up to the CR as
/// the number), `Server`, then `Content-Type` and `Content-Length` on
/// every status but 204 (its client prints a body only after a
/// `Content-Length`). Unlike it we close the connection after each
/// answer, and say so.
pub fn write_response(s: &mut impl Write, status: u16, body: Option<&str>) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status} \r\nServer: {SERVER}\r\nConnection: close\r\n");
    if status != 204 {
        let body = body.unwrap_or("");
        out.push_str("Content-Type: application/json\r\n");
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    if let (Some(b), false) = (body, status == 204) {
        out.push_str(b);
    }
    write_all(s, out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// Input bytes, output sink.
    struct Fake(Cursor<Vec<u8>>, Vec<u8>);
    impl Read for Fake {
        /// At most 16 bytes a call, as a slow client sends.
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            let n = b.len().min(16);
            self.0.read(&mut b[..n])
        }
    }
    impl Write for Fake {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.1.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Stream for Fake {
        fn set_read_deadline(&mut self, _: Duration) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn read(input: &[u8]) -> (Result<Request, ReadError>, Vec<u8>) {
        let mut f = Fake(Cursor::new(input.to_vec()), Vec::new());
        (read_request(&mut f), f.1)
    }

    #[test]
    fn a_request_with_a_body() {
        let (r, _) = read(
            b"PUT /api/v1/vm.resize-disk?x=1 HTTP/1.1\r\nHost: l\r\nContent-Length: 5\r\n\r\nhello",
        );
        assert_eq!(
            r.unwrap(),
            Request {
                method: "PUT".into(),
                path: "/api/v1/vm.resize-disk".into(),
                body: b"hello".to_vec()
            }
        );
    }

    #[test]
    fn expect_continue_is_answered() {
        let (r, out) =
            read(b"PUT /a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 21\r\n\r\n{\"id\":\"0123456789ab\"}");
        assert_eq!(r.unwrap().body, b"{\"id\":\"0123456789ab\"}");
        assert!(out.starts_with(b"HTTP/1.1 100 Continue"));
    }

    #[test]
    fn bad_requests_get_their_status() {
        let huge = format!(
            "PUT /a HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        let long_head = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD));
        let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\n{many}\r\n");
        for (input, status) in [
            (&b"garbage\r\n\r\n"[..], Some(400)),
            (b"GET / HTTP/1.0\r\n\r\n", Some(505)),
            (b"PUT / HTTP/1.1\r\nContent-Length: x\r\n\r\n", Some(400)),
            (
                b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                Some(411),
            ),
            (huge.as_bytes(), Some(413)),
            (long_head.as_bytes(), Some(431)),
            (many.as_bytes(), Some(431)),
            // The client leaves before the end of the head or the body.
            (b"GET / HTTP/1.1\r\nHost:", None),
            (b"PUT / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", None),
        ] {
            let (r, _) = read(input);
            assert_eq!(
                r.unwrap_err().status,
                status,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn responses_carry_length_and_close() {
        let mut out = Vec::new();
        write_response(&mut out, 200, Some("{\"a\":1}")).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 200 \r\nServer: Cloud Hypervisor API\r\n"),
            "{text}"
        );
        assert!(text.contains("Content-Type: application/json\r\nContent-Length: 7\r\n"));
        assert!(text.contains("Connection: close\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"a\":1}"));
        let mut out = Vec::new();
        write_response(&mut out, 204, None).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 204 \r\nServer: Cloud Hypervisor API\r\nConnection: close\r\n\r\n"
        );
        let mut out = Vec::new();
        write_response(&mut out, 404, None).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("Content-Length: 0\r\n\r\n"), "{text}");
    }
}
