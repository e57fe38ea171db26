//! `--serial tty|file=PATH|off|null`: where the 8250 at 0x3F8 writes.
//! Enters as the option string, leaves as the `serial` part of a
//! [`VmConfig`](super::vm_config::VmConfig) ([`ConsoleConfig`]);
//! [`SerialMode::from_config`] is the one check of such a part (the
//! command line's and `vm.create`'s) and what the device manager builds
//! from. The file is not opened here.

use std::path::PathBuf;

use super::error::ConfigError;
use super::vm_config::{ConsoleConfig, ConsoleMode};
use ch_util::kv::KvError;
use ch_util::kv::KvList;

/// Where the serial port's output goes, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SerialMode {
    /// The VMM's stdout.
    Tty,
    File(PathBuf),
    Off,
}

impl SerialMode {
    /// What `c` asks for, or why it cannot be had here.
    pub fn from_config(c: &ConsoleConfig) -> Result<SerialMode, String> {
        if c.iommu {
            return Err("iommu: there is no virtual IOMMU".into());
        }
        match c.mode {
            ConsoleMode::Tty => Ok(SerialMode::Tty),
            ConsoleMode::Off | ConsoleMode::Null => Ok(SerialMode::Off),
            ConsoleMode::File => match c.file.as_deref() {
                Some(p) if !p.is_empty() => Ok(SerialMode::File(PathBuf::from(p))),
                _ => Err("mode File needs a file".into()),
            },
            ConsoleMode::Pty | ConsoleMode::Socket => Err(format!(
                "mode {:?} is not supported: expected Tty, File, Off or Null",
                c.mode
            )),
        }
    }

    /// The `serial` part that asks for this.
    pub fn to_config(&self) -> ConsoleConfig {
        match self {
            SerialMode::Tty => ConsoleConfig::mode(ConsoleMode::Tty),
            SerialMode::Off => ConsoleConfig::mode(ConsoleMode::Off),
            SerialMode::File(p) => ConsoleConfig::file(&p.display().to_string()),
        }
    }
}

pub fn parse_serial(s: &str) -> Result<ConsoleConfig, ConfigError> {
    let mut kv = KvList::parse("--serial", s)?;
    let mode = if kv.take_word("tty") {
        ConsoleConfig::mode(ConsoleMode::Tty)
    } else if kv.take_word("off") {
        ConsoleConfig::mode(ConsoleMode::Off)
    } else if kv.take_word("null") {
        ConsoleConfig::mode(ConsoleMode::Null)
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
        ConsoleConfig::file(&p)
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

    fn mode(s: &str) -> SerialMode {
        SerialMode::from_config(&parse_serial(s).unwrap()).unwrap()
    }

    #[test]
    fn modes() {
        assert_eq!(mode("tty"), SerialMode::Tty);
        assert_eq!(mode("off"), SerialMode::Off);
        assert_eq!(mode("null"), SerialMode::Off);
        assert_eq!(
            mode("file=/tmp/s.log"),
            SerialMode::File("/tmp/s.log".into())
        );
        assert!(parse_serial("pty").unwrap_err().to_string().contains("pty"));
        assert!(parse_serial("tty,file=/x").is_err());
    }

    #[test]
    fn the_api_form() {
        let c: ConsoleConfig = serde_json::from_str(r#"{"mode":"File","file":"/x"}"#).unwrap();
        assert_eq!(
            SerialMode::from_config(&c),
            Ok(SerialMode::File("/x".into()))
        );
        let c: ConsoleConfig = serde_json::from_str(r#"{"mode":"File"}"#).unwrap();
        assert!(SerialMode::from_config(&c).unwrap_err().contains("file"));
        let c: ConsoleConfig = serde_json::from_str(r#"{"mode":"Pty"}"#).unwrap();
        assert!(SerialMode::from_config(&c).unwrap_err().contains("Pty"));
        assert!(serde_json::from_str::<ConsoleConfig>(r#"{"mode":"Fancy"}"#).is_err());
        for m in [
            SerialMode::Tty,
            SerialMode::Off,
            SerialMode::File("/y".into()),
        ] {
            assert_eq!(SerialMode::from_config(&m.to_config()), Ok(m));
        }
    }
}
