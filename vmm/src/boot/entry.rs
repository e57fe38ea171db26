//! How the boot vCPU starts ([`BootEntry`]): what each boot protocol's
//! loader ([`super::pvh`], [`super::bzimage`]) leaves and what
//! `crate::machine` sets the first vCPU's registers from.

/// How the boot vCPU starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootEntry {
    /// 32-bit protected mode at `entry`, `%ebx` = `start_info`.
    Pvh { entry: u64, start_info: u64 },
    /// 64-bit mode at `entry`, `%rsi` = `boot_params`.
    Linux64 { entry: u64, boot_params: u64 },
}
