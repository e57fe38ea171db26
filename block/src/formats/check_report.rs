//! What a consistency check reports ([`CheckReport`], qemu-img check's
//! counters and messages) and the repairs it may make ([`Repair`]): the
//! same for every format that has a check.

/// `-r leaks` or `-r all`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repair {
    Leaks,
    All,
}

/// What `qemu-img check --output=json` reports. After a repair,
/// `corruptions` and `leaks` count what is left (the re-check), and the
/// `*_fixed` fields what was repaired.
#[derive(Clone, Debug, Default)]
pub struct CheckReport {
    pub filename: String,
    pub format: String,
    pub check_errors: u64,
    pub corruptions: u64,
    pub leaks: u64,
    pub corruptions_fixed: u64,
    pub leaks_fixed: u64,
    pub image_end_offset: Option<u64>,
    pub total_clusters: Option<u64>,
    pub allocated_clusters: Option<u64>,
    pub fragmented_clusters: Option<u64>,
    pub compressed_clusters: Option<u64>,
    /// Human-readable findings, one per line, as qemu-img prints them.
    pub messages: Vec<String>,
}

impl CheckReport {
    /// qemu-img check's exit status for a completed check: 0 clean,
    /// 1 check errors, 2 corruptions, 3 leaks only.
    pub fn exit_code(&self) -> u8 {
        if self.check_errors > 0 {
            1
        } else if self.corruptions > 0 {
            2
        } else if self.leaks > 0 {
            3
        } else {
            0
        }
    }
}
