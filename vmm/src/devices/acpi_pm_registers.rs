//! The ACPI PM register block's layout: the one description that the
//! device ([`super::acpi_pm`]) implements and the ACPI tables publish
//! (the FADT's sleep and reset registers, the DSDT's `\_S5`). It sits
//! apart from the device so that the tables, which only need these
//! numbers, do not depend on what the device depends on (the VM's exit
//! signal).

/// Register offsets from [`crate::layout::ACPI_PM_PORT`].
pub const SLEEP_CONTROL_OFFSET: u16 = 0;
pub const SLEEP_STATUS_OFFSET: u16 = 1;
pub const RESET_OFFSET: u16 = 2;
/// What the guest writes to the reset register (FADT RESET_VALUE).
pub const RESET_VALUE: u8 = 0x01;
/// The SLP_TYP value that powers off; the DSDT's `\_S5` declares it.
pub const S5_SLEEP_TYPE: u8 = 5;
