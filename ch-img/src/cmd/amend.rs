//! `ch-img amend` (being written).

use crate::args::OptSpec;
use crate::error::CliError;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "",
    short_flags: "h",
    long_with_value: &[],
    long_flags: &[],
};

pub fn run(_args: &[String]) -> Result<u8, CliError> {
    Err(CliError::Usage("not yet".into()))
}
