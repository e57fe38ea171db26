//! `--serial tty|file=PATH|off|null`: where the 8250 at 0x3F8 writes. Enters as
//! the option string, leaves as a [`SerialMode`]; the file is not opened
//! here.

use std::path::PathBuf;

use super::ConfigError;
use block::options::kv::KvError;
use block::options::kv::KvList;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SerialMode {
    /// The VMM's stdout.
    Tty,
    File(PathBuf),
    Off,
}

pub fn parse_serial(s: &str) -> Result<SerialMode, ConfigError> {
    let mut kv = KvList::parse("--serial", s)?;
    let mode = if kv.take_word("tty") {
        SerialMode::Tty
    } else if kv.take_word("off") || kv.take_word("null") {
        SerialMode::Off
    } else if let Some(p) = kv.take("file")? {
        if p.is_empty() {
            return Err(KvError::BadValue {
                option: "--serial",
                key: "file".into(),
                value: p,
                reason: "empty path".into(),
            }
            .into());
        }
        SerialMode::File(PathBuf::from(p))
    } else {
        return Err(KvError::BadValue {
            option: "--serial",
            key: "mode".into(),
            value: s.to_string(),
            reason: "expected tty, file=PATH, off or null (pty and socket= are not supported)"
                .into(),
        }
        .into());
    };
    kv.finish()?;
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_serial("tty").unwrap(), SerialMode::Tty);
        assert_eq!(parse_serial("off").unwrap(), SerialMode::Off);
        assert_eq!(
            parse_serial("file=/tmp/s.log").unwrap(),
            SerialMode::File("/tmp/s.log".into())
        );
        assert!(parse_serial("pty").unwrap_err().to_string().contains("pty"));
        assert!(parse_serial("tty,file=/x").is_err());
    }
}
