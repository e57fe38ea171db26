//! Where an export listens: `unix:PATH` or `tcp:HOST[:PORT]`, the
//! spelling of `ch-storage-daemon --export type=nbd,addr=...` and of the
//! VMM's backup API, parsed and printed ([`ListenAddr`]).

use std::fmt;
use std::path::PathBuf;

use nbd::wire::consts::DEFAULT_PORT;

/// `unix:PATH` or `tcp:HOST:PORT` (`tcp:[V6]:PORT`; port 10809 when left
/// out, 0 for any free port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

impl ListenAddr {
    pub fn parse(s: &str) -> Result<ListenAddr, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(ListenAddr::Unix(PathBuf::from(p)));
        }
        let Some(hp) = s.strip_prefix("tcp:") else {
            return Err("expected unix:PATH or tcp:HOST:PORT".into());
        };
        let (host, port) = if let Some(rest) = hp.strip_prefix('[') {
            let (h, after) = rest
                .split_once(']')
                .ok_or("an IPv6 host needs its closing ]")?;
            (h, after.strip_prefix(':'))
        } else {
            match hp.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                Some(_) => return Err("put an IPv6 host in brackets: tcp:[::1]:10809".into()),
                None => (hp, None),
            }
        };
        if host.is_empty() {
            return Err("tcp: needs a host".into());
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p.parse().map_err(|_| format!("bad port '{p}'"))?,
        };
        Ok(ListenAddr::Tcp {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp { host, port } if host.contains(':') => {
                write!(f, "tcp:[{host}]:{port}")
            }
            ListenAddr::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print() {
        assert_eq!(
            ListenAddr::parse("unix:/run/a.sock").unwrap(),
            ListenAddr::Unix("/run/a.sock".into())
        );
        for (s, host, port) in [
            ("tcp:localhost:99", "localhost", 99),
            ("tcp:127.0.0.1", "127.0.0.1", 10809),
            ("tcp:[::1]:7", "::1", 7),
        ] {
            let a = ListenAddr::parse(s).unwrap();
            assert_eq!(
                a,
                ListenAddr::Tcp {
                    host: host.into(),
                    port
                }
            );
        }
        assert_eq!(
            ListenAddr::parse("tcp:[::1]:7").unwrap().to_string(),
            "tcp:[::1]:7"
        );
        for bad in [
            "unix:",
            "tcp:",
            "tcp:h:x",
            "tcp:::1:7",
            "udp:x",
            "tcp:h:70000",
        ] {
            assert!(ListenAddr::parse(bad).is_err(), "{bad}");
        }
    }
}
