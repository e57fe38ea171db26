//! One module per ch-img verb. Each `run` takes the words after the verb
//! and returns the process exit status; each `SPEC` is the options its
//! parser takes ([`option_spec`], which the help test reads).

pub mod amend;
pub mod bench;
pub mod bitmap;
pub mod check;
pub mod commit;
pub mod compare;
pub mod convert;
pub mod create;
pub mod dd;
pub mod info;
pub mod map;
pub mod measure;
pub mod rebase;
pub mod resize;
pub mod snapshot;

use std::io::Write;

#[cfg(test)]
use crate::args::OptSpec;
use crate::error::CliError;
use crate::json_style::QemuJson;

/// The options verb `verb`'s parser takes (`None`: no such verb); the
/// help test holds each verb's help against it.
#[cfg(test)]
pub fn option_spec(verb: &str) -> Option<&'static OptSpec> {
    Some(match verb {
        "amend" => &amend::SPEC,
        "bench" => &bench::SPEC,
        "bitmap" => &bitmap::SPEC,
        "check" => &check::SPEC,
        "commit" => &commit::SPEC,
        "compare" => &compare::SPEC,
        "convert" => &convert::SPEC,
        "create" => &create::SPEC,
        "dd" => &dd::SPEC,
        "info" => &info::SPEC,
        "map" => &map::SPEC,
        "measure" => &measure::SPEC,
        "rebase" => &rebase::SPEC,
        "resize" => &resize::SPEC,
        "snapshot" => &snapshot::SPEC,
        _ => return None,
    })
}

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
