//! `--api-socket path=PATH` or `--api-socket fd=N` (Cloud Hypervisor's
//! keys; a bare PATH works too): where the HTTP API listens. Enters as
//! the option string, leaves as an [`ApiSocketConfig`]; nothing is
//! created or checked on disk here.

use std::os::fd::RawFd;
use std::path::PathBuf;

use block::options::kv::{KvError, KvList};

use super::ConfigError;

/// Where the API server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiSocketConfig {
    /// A Unix socket the VMM creates (owner-only) and removes at exit.
    Path(PathBuf),
    /// A listening Unix socket inherited from the parent.
    Fd(RawFd),
}

pub fn parse_api_socket(s: &str) -> Result<ApiSocketConfig, ConfigError> {
    let bad = |key: &str, value: &str, reason: &str| KvError::BadValue {
        option: "--api-socket",
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
    };
    if !s.contains('=') {
        if s.is_empty() {
            return Err(bad("path", s, "empty path").into());
        }
        return Ok(ApiSocketConfig::Path(PathBuf::from(s)));
    }
    let mut kv = KvList::parse("--api-socket", s)?;
    let path = kv.take("path")?;
    let fd = kv.take("fd")?;
    kv.finish()?;
    match (path, fd) {
        (Some(p), None) if !p.is_empty() => Ok(ApiSocketConfig::Path(PathBuf::from(p))),
        (Some(p), None) => Err(bad("path", &p, "empty path").into()),
        (None, Some(f)) => match f.parse::<RawFd>() {
            Ok(n) if n >= 3 => Ok(ApiSocketConfig::Fd(n)),
            _ => Err(bad("fd", &f, "expected a file descriptor number of at least 3").into()),
        },
        (Some(_), Some(_)) => Err(KvError::Conflict {
            option: "--api-socket",
            first: "path".into(),
            second: "fd".into(),
            reason: "give one of the two".into(),
        }
        .into()),
        (None, None) => Err(KvError::MissingKey {
            option: "--api-socket",
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
}
