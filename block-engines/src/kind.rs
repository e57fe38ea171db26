//! [`EngineKind`]: which engine runs a queue's host operations, by the
//! name `engine=` takes.

use std::str::FromStr;

/// Which I/O engine executes the plans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// io_uring when the kernel offers a ring with every opcode we use;
    /// else aio on O_DIRECT images that are fully allocated; else threads.
    /// Resolved once, at open, by the block crate's engine choice.
    #[default]
    Auto,
    IoUring,
    /// Linux native AIO (needs O_DIRECT to be asynchronous).
    Aio,
    /// A pool of worker threads per disk.
    Threads,
    Sync,
}

impl EngineKind {
    pub const ALL: [EngineKind; 5] = [
        EngineKind::Auto,
        EngineKind::IoUring,
        EngineKind::Aio,
        EngineKind::Threads,
        EngineKind::Sync,
    ];

    /// The name `engine=` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::IoUring => "io_uring",
            EngineKind::Aio => "aio",
            EngineKind::Threads => "threads",
            EngineKind::Sync => "sync",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!("unknown engine '{s}' (expected auto, io_uring, aio, threads or sync)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_round_trip_and_the_error_lists_them_all() {
        for k in EngineKind::ALL {
            assert_eq!(k.as_str().parse::<EngineKind>(), Ok(k));
        }
        let err = "native".parse::<EngineKind>().unwrap_err();
        for name in ["'native'", "auto", "io_uring", "aio", "threads", "sync"] {
            assert!(err.contains(name), "{err}");
        }
    }
}
