//! `-o help`: the options `create` and `convert` take for a new image of
//! a format, and the ones `amend` changes, printed as qemu-img 7.2
//! prints them (its header line, `  name=<type>` padded to 22 columns,
//! ` - ` and the description, in name order, and its closing lines).
//!
//! `-o` values enter ([`wants_help`]); the text leaves. The lists are
//! each format's, in its driver (`block::formats::FormatDriver`): the
//! options ch-img takes, in qemu-img's words.

use block::formats::{FormatDriver, OptionDoc};

use crate::error::CliError;

/// Whether `-o` values ask for help (an item `help` or `?`, as qemu's
/// `is_help_option`).
pub fn wants_help(values: &[&str]) -> bool {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .any(|item| item == "help" || item == "?")
}

fn lines(header: &str, docs: &[OptionDoc], footer: bool) -> String {
    let mut text = format!("{header}\n");
    for d in docs {
        let left = format!("{}=<{}>", d.name, d.kind);
        text.push_str(&format!("  {left:<22} - {}\n", d.help));
    }
    if footer {
        text.push_str(
            "\nThe protocol level may support further options.\nSpecify the target filename to include those options.\n",
        );
    }
    text
}

/// What `create` / `convert` print for `-o help`: the options of a new
/// image of `format`, with those of the file protocol when the command
/// names the new file.
pub fn create_help(format: &FormatDriver, with_filename: bool) -> String {
    if with_filename {
        lines("Supported options:", format.create_options_with_file, false)
    } else {
        lines(
            &format!("Supported {} options:", format.name),
            format.create_options,
            true,
        )
    }
}

/// What `amend -o help` prints for an image of `format`; a format with
/// nothing to amend gets qemu-img's error.
pub fn amend_help(format: &FormatDriver) -> Result<String, CliError> {
    match format.amend_options {
        Some(docs) => Ok(lines(
            &format!("Amend options for '{}':", format.name),
            docs,
            false,
        )),
        None => Err(CliError::Usage(format!(
            "Format driver '{}' does not support option amendment",
            format.name
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::formats::FORMATS;

    #[test]
    fn help_items_are_found_among_others() {
        assert!(wants_help(&["cluster_size=4k,help"]));
        assert!(wants_help(&["a=1", "?"]));
        assert!(!wants_help(&["helpful=1", "size=help"]));
    }

    #[test]
    fn lines_are_padded_like_qemu_img() {
        let qcow2 = FORMATS.by_name("qcow2").unwrap();
        let text = amend_help(qcow2).unwrap();
        assert!(text.contains("\n  backing_file=<str>     - File name of a base image\n"));
        assert!(text.contains(
            "\n  data_file_raw=<bool (on/off)> - The external data file must stay valid as a raw image\n"
        ));
        assert!(create_help(FORMATS.fallback(), false).ends_with("include those options.\n"));
        assert!(create_help(qcow2, true).starts_with("Supported options:\n"));
    }
}
