//! One module per ch-img verb. Each `run` takes the words after the verb
//! and returns the process exit status; each `SPEC` is the options its
//! parser takes ([`option_spec`], which the help test reads). What the
//! verbs share sits below them, in [`output`] (`--output`, qemu-img's
//! JSON layout).

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

mod output;

pub use output::{print_json, OutputFormat};

#[cfg(test)]
use crate::args::OptSpec;

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
