//! QEMU's cache modes (`cache=` of `-drive`, `-t`/`-T` of qemu-img), as
//! three independent facts about how an image is used: O_DIRECT or not,
//! whether the guest (or tool) sees a volatile write cache, and whether
//! flushes reach the disk.
//!
//! | mode | write cache | O_DIRECT | flushes |
//! | --- | --- | --- | --- |
//! | writeback | on | off | kept |
//! | none | on | on | kept |
//! | writethrough | off | off | kept |
//! | directsync | off | on | kept |
//! | unsafe | on | off | ignored |
//!
//! "Write cache off" means every write is durable before it completes (the
//! user of the disk flushes after each write).

use std::fmt;
use std::str::FromStr;

/// One of QEMU's five cache modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheMode {
    #[default]
    Writeback,
    None,
    Writethrough,
    Directsync,
    Unsafe,
}

impl CacheMode {
    pub const ALL: [CacheMode; 5] = [
        CacheMode::None,
        CacheMode::Writeback,
        CacheMode::Writethrough,
        CacheMode::Directsync,
        CacheMode::Unsafe,
    ];

    /// Open the image's files with O_DIRECT.
    pub fn direct(self) -> bool {
        matches!(self, CacheMode::None | CacheMode::Directsync)
    }

    /// Writes may complete before they are durable (a volatile write cache
    /// that flushes empty); false means each write is made durable first.
    pub fn writeback(self) -> bool {
        !matches!(self, CacheMode::Writethrough | CacheMode::Directsync)
    }

    /// Flushes reach the disk (false only for `unsafe`).
    pub fn flushes(self) -> bool {
        self != CacheMode::Unsafe
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::Writeback => "writeback",
            CacheMode::None => "none",
            CacheMode::Writethrough => "writethrough",
            CacheMode::Directsync => "directsync",
            CacheMode::Unsafe => "unsafe",
        }
    }
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CacheMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown cache mode '{s}' (expected none, writeback, writethrough, directsync or unsafe)"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_table() {
        let row = |m: CacheMode| (m.writeback(), m.direct(), m.flushes());
        assert_eq!(row(CacheMode::Writeback), (true, false, true));
        assert_eq!(row(CacheMode::None), (true, true, true));
        assert_eq!(row(CacheMode::Writethrough), (false, false, true));
        assert_eq!(row(CacheMode::Directsync), (false, true, true));
        assert_eq!(row(CacheMode::Unsafe), (true, false, false));
    }

    #[test]
    fn parses_its_own_names_only() {
        for m in CacheMode::ALL {
            assert_eq!(m.as_str().parse::<CacheMode>(), Ok(m));
        }
        let err = "nocache".parse::<CacheMode>().unwrap_err();
        assert!(
            err.contains("nocache") && err.contains("directsync"),
            "{err}"
        );
    }
}
