//! ch-img's error type: what a verb failed to do, with the block layer's
//! or the OS's cause attached. `main` prints the chain on one line and maps
//! it to qemu-img's exit status for the verb.

use std::io;
use std::path::PathBuf;

use block::BlockError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CliError {
    /// Bad command line; the message names the option or operand.
    #[error("{0}")]
    Usage(String),
    /// A command line getopt cannot take (unknown option, missing
    /// argument) or without its operands: qemu-img exits 1 for it and
    /// adds its `Try ... --help` hint, whatever the verb.
    #[error("{0}\nTry 'ch-img --help' for more information")]
    Syntax(String),
    #[error("Could not open '{path}'")]
    Open {
        path: PathBuf,
        #[source]
        source: BlockError,
    },
    #[error("Could not open '{path}' with cache mode '{mode}': the file system refuses O_DIRECT")]
    DirectRefused {
        path: PathBuf,
        mode: block::options::CacheMode,
        #[source]
        source: BlockError,
    },
    /// The image file itself does not open (qemu-img's words).
    #[error("Could not open '{path}': Could not open '{path}': {reason}")]
    OpenFile { path: String, reason: String },
    /// An NBD export does not open: the path as given, once, then why.
    #[error("Could not open '{path}': {reason}")]
    OpenNbd { path: String, reason: String },
    #[error("Could not open '{path}': force-share=on can only be used with read-only images")]
    ForceShareWritable { path: PathBuf },
    /// `convert` could not create its output (qemu-img's words).
    #[error("{}: error while converting {format}", path.display())]
    ConvertCreate {
        path: PathBuf,
        format: &'static str,
        #[source]
        source: BlockError,
    },
    /// Creating an image failed; qemu-img names the file first.
    #[error("{}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: BlockError,
    },
    /// `dd` could not create its output (qemu-img's words).
    #[error("{}: error while creating output image", path.display())]
    CreateOutput {
        path: PathBuf,
        #[source]
        source: BlockError,
    },
    #[error("error while reading at byte {offset}")]
    Read {
        offset: u64,
        #[source]
        source: BlockError,
    },
    #[error("error while writing at byte {offset}")]
    Write {
        offset: u64,
        #[source]
        source: BlockError,
    },
    #[error("error while writing at byte {offset} of '{path}'")]
    WriteOutput {
        path: PathBuf,
        offset: u64,
        #[source]
        source: BlockError,
    },
    #[error("error while flushing the image")]
    Flush(#[source] BlockError),
    #[error("error while closing the image")]
    Close(#[source] BlockError),
    #[error("Error resizing image")]
    Resize(#[source] BlockError),
    #[error("Error while amending options")]
    Amend(#[source] BlockError),
    #[error("Error while changing the bitmaps")]
    Bitmap(#[source] BlockError),
    #[error("could not query block status at byte {offset}")]
    BlockStatus {
        offset: u64,
        #[source]
        source: BlockError,
    },
    #[error("could not write the output file {path}")]
    OutputFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not {what}")]
    Os {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("Could not {what}")]
    Snapshot {
        what: String,
        #[source]
        source: BlockError,
    },
    /// `map`'s table cannot show a data extent without a host offset.
    #[error("File contains external, encrypted or compressed clusters.")]
    NotMappable,
    #[error("could not write to standard output")]
    Stdout(#[source] io::Error),
}

/// The error and its causes on one line, as qemu-img prints them.
pub use ch_log::error_chain as chain;

/// `e` and its causes on one line, each OS error as `strerror` words it
/// (without Rust's " (os error N)"), as qemu-img prints them.
pub fn chain_without_errno(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        parts.push(match c.downcast_ref::<io::Error>() {
            Some(io) => os_message(io),
            None => c.to_string(),
        });
        cur = c.source();
    }
    parts.join(": ")
}

/// The errno of a block error as qemu-img prints a failed call's
/// result: `-95 (Operation not supported)`.
pub fn errno_message(e: &BlockError) -> String {
    let errno = e.errno();
    format!(
        "-{errno} ({})",
        os_message(&io::Error::from_raw_os_error(errno))
    )
}

/// An OS error as C's `strerror` words it (qemu-img's messages), without
/// Rust's " (os error N)".
pub fn os_message(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}
