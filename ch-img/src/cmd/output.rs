//! How the verbs print: the `--output` choice and JSON laid out the way
//! qemu-img lays it out. Every verb that prints a report uses these.

use std::io::Write;

use crate::error::CliError;
use crate::json_style::QemuJson;

/// `--output=human|json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Human,
    Json,
}

impl OutputFormat {
    pub fn parse(value: Option<&str>) -> Result<Self, CliError> {
        match value {
            None | Some("human") => Ok(Self::Human),
            Some("json") => Ok(Self::Json),
            Some(other) => Err(CliError::Usage(format!(
                "--output must be used with human or json as argument (not '{other}')"
            ))),
        }
    }
}

/// Prints a JSON value the way qemu-img does: four-space indentation.
pub fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, QemuJson::default());
    serde::Serialize::serialize(value, &mut ser).map_err(|e| CliError::Stdout(e.into()))?;
    out.push(b'\n');
    std::io::stdout().write_all(&out).map_err(CliError::Stdout)
}
