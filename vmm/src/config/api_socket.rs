//! `--api-socket path=PATH` or `--api-socket fd=N` (Cloud Hypervisor's
//! keys; a bare PATH works too): where the HTTP API listens; and
//! `--event-monitor path=PATH|fd=N` (upstream's keys, no bare path):
//! where events are written. Both enter as the option string and leave
//! as a [`PathOrFd`]; nothing is created or checked on disk here.

use std::os::fd::RawFd;
use std::path::PathBuf;

use ch_util::kv::{KvError, KvList};

use super::error::ConfigError;

/// A file the VMM opens (or creates) by path, or a descriptor inherited
/// from the parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathOrFd {
    Path(PathBuf),
    Fd(RawFd),
}

/// Where the API server listens: a Unix socket the VMM creates
/// (owner-only) and removes at exit, or a listening one inherited.
pub type ApiSocketConfig = PathOrFd;

/// Where `--event-monitor` writes: a file the VMM creates (truncated,
/// as upstream), or an inherited descriptor (a pipe, say).
pub type EventMonitorConfig = PathOrFd;

pub fn parse_api_socket(s: &str) -> Result<ApiSocketConfig, ConfigError> {
    parse_path_or_fd("--api-socket", s, true)
}

pub fn parse_event_monitor(s: &str) -> Result<EventMonitorConfig, ConfigError> {
    parse_path_or_fd("--event-monitor", s, false)
}

fn parse_path_or_fd(
    option: &'static str,
    s: &str,
    bare_path: bool,
) -> Result<PathOrFd, ConfigError> {
    let bad = |key: &str, value: &str, reason: &str| KvError::BadValue {
        option,
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
    };
    if bare_path && !s.contains('=') {
        if s.is_empty() {
            return Err(bad("path", s, "empty path").into());
        }
        return Ok(ApiSocketConfig::Path(PathBuf::from(s)));
    }
    let mut kv = KvList::parse(option, s)?;
    let path = kv.take("path")?;
    let fd = kv.take("fd")?;
    kv.finish()?;
    match (path, fd) {
        (Some(p), None) if !p.is_empty() => Ok(PathOrFd::Path(PathBuf::from(p))),
        (Some(p), None) => Err(bad("path", &p, "empty path").into()),
        (None, Some(f)) => match f.parse::<RawFd>() {
            Ok(n) if n >= 3 => Ok(PathOrFd::Fd(n)),
            _ => Err(bad("fd", &f, "expected a file descriptor number of at least 3").into()),
        },
        (Some(_), Some(_)) => Err(KvError::Conflict {
            option,
            first: "path".into(),
            second: "fd".into(),
            reason: "give one of the two".into(),
        }
        .into()),
        (None, None) => Err(KvError::MissingKey {
            option,
            key: "path",
        }
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_fd_and_errors() {
        assert_eq!(
            parse_api_socket("path=/run/ch.sock").unwrap(),
            ApiSocketConfig::Path("/run/ch.sock".into())
        );
        assert_eq!(
            parse_api_socket("/tmp/a.sock").unwrap(),
            ApiSocketConfig::Path("/tmp/a.sock".into())
        );
        assert_eq!(parse_api_socket("fd=7").unwrap(), ApiSocketConfig::Fd(7));
        for (bad, word) in [
            ("fd=1", "fd"),
            ("fd=x", "fd"),
            ("path=", "path"),
            ("", "path"),
            ("path=/a,fd=4", "conflict"),
            ("mode=0600", "mode"),
            ("path=/a,path=/b", "twice"),
        ] {
            let e = parse_api_socket(bad).unwrap_err().to_string();
            assert!(e.contains(word), "{bad}: {e}");
        }
    }

    #[test]
    fn event_monitor_takes_path_or_fd_only() {
        assert_eq!(
            parse_event_monitor("path=/tmp/ev.json").unwrap(),
            PathOrFd::Path("/tmp/ev.json".into())
        );
        assert_eq!(parse_event_monitor("fd=9").unwrap(), PathOrFd::Fd(9));
        for (bad, word) in [
            ("/tmp/ev.json", "--event-monitor"),
            ("fd=2", "fd"),
            ("path=", "path"),
            ("path=/a,fd=4", "conflict"),
        ] {
            let e = parse_event_monitor(bad).unwrap_err().to_string();
            assert!(e.contains(word), "{bad}: {e}");
        }
    }
}
