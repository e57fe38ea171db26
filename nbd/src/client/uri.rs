//! NBD URIs as QEMU spells them (and libnbd, nbdinfo, fio accept):
//!
//! - `nbd://HOST[:PORT]/NAME` (also `nbd+tcp://`): TCP, port 10809 by
//!   default; an IPv6 host goes in brackets (`nbd://[::1]:10809/x`);
//! - `nbd+unix:///NAME?socket=PATH`: a Unix socket, no host;
//! - QEMU's older spelling without `//`: `nbd:unix:PATH[:exportname=NAME]`
//!   and `nbd:HOST:PORT[:exportname=NAME]` (`nbd:[V6]:PORT`), where the
//!   name is everything after the first `:exportname=`, as written (no
//!   percent-decoding), and the port is required.
//!
//! In a URI the export name is the path after the first `/`,
//! percent-decoded; an absent or empty path is the empty (default)
//! export name. TLS schemes (`nbds...`) and RDMA are refused, as are
//! query keys QEMU does not take (none for TCP, only `socket` for Unix).
//!
//! [`NbdUri::qemu_name`] is the name QEMU gives an opened export (what
//! `qemu-img info` prints as `image:`), whatever spelling opened it.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::wire::consts::{DEFAULT_PORT, MAX_STRING};

/// Where the server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdAddr {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub addr: NbdAddr,
    pub export: String,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("NBD URI '{uri}': {reason}")]
pub struct UriError {
    pub uri: String,
    pub reason: String,
}

impl NbdUri {
    /// Whether `s` is spelled as an NBD URI (`nbd://`, `nbd+...://`,
    /// `nbds...://`) or in QEMU's older `nbd:...` spelling, so a path
    /// taker should parse it rather than open a file of that name (QEMU
    /// takes these names the same way).
    pub fn looks_like(s: &str) -> bool {
        let scheme = s.split_once("://").map(|(scheme, _)| scheme);
        s.starts_with("nbd:")
            || scheme
                .is_some_and(|sc| sc == "nbd" || sc.starts_with("nbd+") || sc.starts_with("nbds"))
    }

    pub fn parse(s: &str) -> Result<NbdUri, UriError> {
        let err = |reason: &str| UriError {
            uri: s.to_string(),
            reason: reason.to_string(),
        };
        if !s.contains("://") {
            if let Some(rest) = s.strip_prefix("nbd:") {
                return parse_legacy(rest).map_err(|reason| err(&reason));
            }
        }
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| err("expected SCHEME:// (or nbd:unix:PATH, nbd:HOST:PORT)"))?;
        let unix = match scheme {
            "nbd" | "nbd+tcp" => false,
            "nbd+unix" => true,
            s if s.starts_with("nbds") => return Err(err("TLS (nbds) is not supported")),
            "nbd+rdma" => return Err(err("RDMA is not supported")),
            _ => return Err(err("scheme must be nbd, nbd+tcp or nbd+unix")),
        };
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        if before_query.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(err("fragments (#) are not allowed"));
        }
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i + 1..]),
            None => (before_query, ""),
        };
        let export =
            percent_decode(path).ok_or_else(|| err("bad percent-encoding in the export name"))?;
        if export.len() > MAX_STRING {
            return Err(err("export name longer than 4096 bytes"));
        }
        let addr = if unix {
            if !authority.is_empty() {
                return Err(err("nbd+unix takes no host (nbd+unix:///NAME?socket=PATH)"));
            }
            let q = query.ok_or_else(|| err("nbd+unix needs ?socket=PATH"))?;
            let mut socket = None;
            for pair in q.split('&').filter(|p| !p.is_empty()) {
                match pair.split_once('=') {
                    Some(("socket", v)) if socket.is_none() => {
                        let v = percent_decode(v)
                            .ok_or_else(|| err("bad percent-encoding in socket"))?;
                        socket = Some(PathBuf::from(v));
                    }
                    Some(("socket", _)) => return Err(err("socket given twice")),
                    _ => {
                        return Err(err(&format!(
                            "unknown query parameter '{pair}' (only socket)"
                        )))
                    }
                }
            }
            match socket {
                Some(p) if !p.as_os_str().is_empty() => NbdAddr::Unix(p),
                _ => return Err(err("nbd+unix needs ?socket=PATH")),
            }
        } else {
            if query.is_some_and(|q| !q.is_empty()) {
                return Err(err("nbd:// takes no query parameters"));
            }
            let (host, port) = split_host_port(authority).ok_or_else(|| err("bad host or port"))?;
            if host.is_empty() {
                return Err(err("nbd:// needs a host"));
            }
            NbdAddr::Tcp { host, port }
        };
        Ok(NbdUri { addr, export })
    }

    /// The name QEMU's NBD driver gives the export once open (its
    /// "exact filename"; `qemu-img info` prints it as `image:`):
    /// `nbd://HOST:PORT[/NAME]` with the port always written and an IPv6
    /// host without brackets, `nbd+unix:///NAME?socket=PATH` or, for the
    /// empty name, `nbd+unix://?socket=PATH`; the name and the socket
    /// path as they are, not percent-encoded.
    pub fn qemu_name(&self) -> String {
        let export = if self.export.is_empty() {
            String::new()
        } else {
            format!("/{}", self.export)
        };
        match &self.addr {
            NbdAddr::Tcp { host, port } => format!("nbd://{host}:{port}{export}"),
            NbdAddr::Unix(p) => format!("nbd+unix://{export}?socket={}", p.display()),
        }
    }
}

/// QEMU's older spelling, after `nbd:`: `unix:PATH` or `HOST:PORT`
/// (`[V6]:PORT`), then optionally `:exportname=NAME`.
fn parse_legacy(rest: &str) -> Result<NbdUri, String> {
    const EXPORT_NAME: &str = ":exportname=";
    let (server, export) = match rest.find(EXPORT_NAME) {
        Some(i) => (&rest[..i], &rest[i + EXPORT_NAME.len()..]),
        None => (rest, ""),
    };
    if export.len() > MAX_STRING {
        return Err("export name longer than 4096 bytes".into());
    }
    if export.is_empty() && server.len() < rest.len() {
        // QEMU refuses it too; the default export is asked by leaving
        // `:exportname=` out.
        return Err("empty :exportname= (leave it out for the default export)".into());
    }
    let addr = if let Some(path) = server.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("nbd:unix: needs a socket path (nbd:unix:PATH[:exportname=NAME])".into());
        }
        NbdAddr::Unix(PathBuf::from(path))
    } else {
        let usage = "expected nbd:unix:PATH or nbd:HOST:PORT, then optionally :exportname=NAME";
        if server.is_empty() {
            return Err(format!("no server address: {usage}"));
        }
        let (host, port) = match server.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or(usage)?;
                (host, after.strip_prefix(':').ok_or(usage)?)
            }
            None => server.rsplit_once(':').ok_or(usage)?,
        };
        if host.is_empty() || host.contains(':') && !server.starts_with('[') {
            return Err(format!("bad host '{host}': {usage}"));
        }
        if port.contains(',') {
            return Err("socket options after the port (,ipv4 ...) are not supported".into());
        }
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port '{port}'"))?;
        NbdAddr::Tcp {
            host: host.to_string(),
            port,
        }
    };
    Ok(NbdUri {
        addr,
        export: export.to_string(),
    })
}

/// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`.
fn split_host_port(a: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':')?)),
        }
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return None,
            None => (a, None),
        }
    };
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(p) => p.parse().ok().filter(|p| *p != 0)?,
    };
    Some((host.to_string(), port))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn percent_encode(s: &str, keep: &[u8]) -> String {
    let mut out = String::new();
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) || keep.contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let export = percent_encode(&self.export, b"/");
        match &self.addr {
            NbdAddr::Unix(p) => write!(
                f,
                "nbd+unix:///{export}?socket={}",
                percent_encode(&p.to_string_lossy(), b"/")
            ),
            NbdAddr::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{export}")
            }
            NbdAddr::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{export}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri {
            addr: NbdAddr::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
        }
    }

    #[test]
    fn qemu_spellings_parse() {
        assert_eq!(NbdUri::parse("nbd://h/x").unwrap(), tcp("h", 10809, "x"));
        assert_eq!(NbdUri::parse("nbd+tcp://h:99/").unwrap(), tcp("h", 99, ""));
        assert_eq!(NbdUri::parse("nbd://h").unwrap(), tcp("h", 10809, ""));
        assert_eq!(
            NbdUri::parse("nbd://[::1]:7/a%20b").unwrap(),
            tcp("::1", 7, "a b")
        );
        assert_eq!(
            NbdUri::parse("nbd://h/a/b").unwrap(),
            tcp("h", 10809, "a/b")
        );
        assert_eq!(
            NbdUri::parse("nbd+unix:///exp?socket=/run/s.sock").unwrap(),
            NbdUri {
                addr: NbdAddr::Unix("/run/s.sock".into()),
                export: "exp".into()
            }
        );
        assert_eq!(
            NbdUri::parse("nbd+unix://?socket=/s").unwrap().export,
            "",
            "no path is the default export"
        );
        for s in ["nbd://h:1/x", "nbd+unix:///e?socket=/a/b", "nbd://[::1]:2/"] {
            assert_eq!(NbdUri::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn qemus_older_spelling_parses() {
        let unix = |p: &str, export: &str| NbdUri {
            addr: NbdAddr::Unix(p.into()),
            export: export.into(),
        };
        assert_eq!(
            NbdUri::parse("nbd:unix:/run/s").unwrap(),
            unix("/run/s", "")
        );
        assert_eq!(
            NbdUri::parse("nbd:unix:/run/s:exportname=a b/c").unwrap(),
            unix("/run/s", "a b/c"),
            "the name is taken as written"
        );
        assert_eq!(
            NbdUri::parse("nbd:unix:/a:b:exportname=x:exportname=y").unwrap(),
            unix("/a:b", "x:exportname=y"),
            "the first :exportname= ends the path"
        );
        assert_eq!(NbdUri::parse("nbd:h:99").unwrap(), tcp("h", 99, ""));
        assert_eq!(
            NbdUri::parse("nbd:127.0.0.1:10809:exportname=e").unwrap(),
            tcp("127.0.0.1", 10809, "e")
        );
        assert_eq!(
            NbdUri::parse("nbd:[::1]:7:exportname=%41").unwrap(),
            tcp("::1", 7, "%41")
        );
    }

    #[test]
    fn qemu_names_the_export_as_qemu_img_info_prints_it() {
        for (spelled, named) in [
            ("nbd://127.0.0.1/exp", "nbd://127.0.0.1:10809/exp"),
            ("nbd+tcp://h:99/exp", "nbd://h:99/exp"),
            ("nbd://[::1]:10810/", "nbd://::1:10810"),
            ("nbd://h", "nbd://h:10809"),
            ("nbd+unix:///?socket=/s", "nbd+unix://?socket=/s"),
            ("nbd+unix://?socket=/s", "nbd+unix://?socket=/s"),
            (
                "nbd+unix:///a%20b%2Fc?socket=/s",
                "nbd+unix:///a b/c?socket=/s",
            ),
            ("nbd:unix:/s:exportname=e", "nbd+unix:///e?socket=/s"),
            ("nbd:unix:/s", "nbd+unix://?socket=/s"),
            ("nbd:[::1]:7", "nbd://::1:7"),
        ] {
            assert_eq!(
                NbdUri::parse(spelled).unwrap().qemu_name(),
                named,
                "{spelled}"
            );
        }
    }

    #[test]
    fn bad_uris_say_why() {
        for (s, why) in [
            ("nbds://h/x", "TLS"),
            ("http://h/x", "scheme"),
            ("nbd+unix:///x", "socket"),
            ("nbd+unix://host/x?socket=/s", "no host"),
            ("nbd+unix:///x?socket=/s&x=1", "unknown query"),
            ("nbd://h/x?socket=/s", "no query"),
            ("nbd:///x", "needs a host"),
            ("nbd://h:0/x", "port"),
            ("nbd://h:99999/x", "port"),
            ("nbd://h/%zz", "percent"),
            ("nbd", "SCHEME"),
        ] {
            let e = NbdUri::parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
        for (s, why) in [
            ("nbd:", "no server address"),
            ("nbd:localhost", "expected nbd:unix:PATH"),
            ("nbd:unix:", "socket path"),
            ("nbd:h:0", "bad port"),
            ("nbd:h:nbd", "bad port"),
            ("nbd:h:1,ipv4", "socket options"),
            ("nbd:::1:7", "bad host"),
            ("nbd:[::1:7", "expected nbd:unix:PATH"),
            ("nbd:unix:/s:exportname=", "empty :exportname="),
        ] {
            let e = NbdUri::parse(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
        assert!(NbdUri::looks_like("nbd+unix:///?socket=x"));
        assert!(NbdUri::looks_like("nbd:unix:/s"));
        assert!(NbdUri::looks_like("nbd:h:1"));
        assert!(NbdUri::looks_like("nbds://h/"));
        assert!(!NbdUri::looks_like("disk.qcow2"));
        assert!(!NbdUri::looks_like("/a/nbd://b"));
    }
}
