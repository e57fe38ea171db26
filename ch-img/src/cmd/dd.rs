//! `ch-img dd [-U] [-f fmt] [-O output_fmt] [bs=N] [count=N] [skip=N] if=INPUT of=OUTPUT`
//!
//! qemu-img 7.2's dd: the operands are parsed as qemu-img parses them (a
//! later one wins; sizes take qemu-img's suffixes; `bs` from 1 to
//! 2147483647, default 512). The output is created (or truncated) in
//! `-O`'s format (raw by default), as large as the input minus `skip`
//! blocks, or `count` blocks when that is less, minus `skip` blocks
//! (qemu-img counts `count` from the start of the input, not from the
//! skipped offset, and so does ch-img); a `skip` past the end prints
//! qemu-img's warning and leaves an empty output. Then every block is
//! read from the input and written to the output, zeroes included, as
//! qemu-img writes them. Nothing is printed on success.
//!
//! The output is created as `convert` creates its own
//! ([`block::create::create_image`] with the input's files as
//! [`CreateOptions::sources`]): locked like a writer before it is
//! truncated, and refused when it is one of the files the input reads
//! (the same file, a link to it, its data file or backing file), so the
//! input is never truncated (qemu-img refuses a qcow2 input on its lock,
//! and copies a raw one onto itself, losing what a smaller output cuts
//! off). Errors are worded as qemu-img's ("error while creating output
//! image").

use block::create::{create_image, CreateOptions};
use block::ImageType;

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::{open_image, parse_format};
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "fO",
    short_flags: "Uh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

/// qemu-img's largest block size.
const MAX_BS: u64 = i32::MAX as u64;

/// The operands after parsing.
#[derive(Debug, Default, PartialEq, Eq)]
struct Operands {
    bs: u64,
    count: Option<u64>,
    skip: Option<u64>,
    input: Option<String>,
    output: Option<String>,
}

fn suffix_error(what: &str) -> CliError {
    // qemu-img reports this on two lines, each with its name.
    CliError::Usage(format!(
        "Invalid {what} specified. You may use k, M, G, T, P or E suffixes for\nch-img: kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes."
    ))
}

fn parse_operands(words: &[String]) -> Result<Operands, CliError> {
    let mut ops = Operands {
        bs: 512,
        ..Default::default()
    };
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            return Err(CliError::Usage(format!("unrecognized operand {word}")));
        };
        match key {
            "bs" => {
                let bs = parse_size(value).ok().ok_or_else(|| suffix_error("bs"))?;
                if !(1..=MAX_BS).contains(&bs) {
                    return Err(CliError::Usage(format!(
                        "Invalid bs specified. Must be between 1 and {MAX_BS}."
                    )));
                }
                ops.bs = bs;
            }
            "count" => {
                ops.count = Some(
                    parse_size(value)
                        .ok()
                        .ok_or_else(|| suffix_error("count"))?,
                )
            }
            "skip" => ops.skip = Some(parse_size(value).ok().ok_or_else(|| suffix_error("skip"))?),
            "if" => ops.input = Some(value.to_string()),
            "of" => ops.output = Some(value.to_string()),
            _ => return Err(CliError::Usage(format!("unrecognized operand {key}"))),
        }
    }
    Ok(ops)
}

/// (end of the copied input range, where the copy starts in the input):
/// qemu-img's arithmetic. `None` for the start: `skip` lies past the end.
fn copy_range(ops: &Operands, input_size: u64) -> (u64, Option<u64>) {
    let mut end = input_size;
    if let Some(count) = ops.count {
        if let Some(bytes) = count.checked_mul(ops.bs).filter(|b| *b < end) {
            end = bytes;
        }
    }
    let start = match ops.skip {
        Some(skip) => skip.checked_mul(ops.bs).filter(|s| *s <= end),
        None => Some(0),
    };
    (end, start)
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let ops = parse_operands(&p.operands)?;
    let (Some(input), Some(output)) = (&ops.input, &ops.output) else {
        return Err(CliError::Usage(
            "Must specify both input and output files".into(),
        ));
    };
    // qemu-img opens the input before it looks up the output's format.
    let in_format = parse_format(p.value("f")).map_err(|_| {
        CliError::Usage(format!(
            "Could not open '{input}': Unknown driver '{}'",
            p.value("f").unwrap_or_default()
        ))
    })?;
    let source = open_image(input, in_format, true)?;
    let out_format = match parse_format(p.value("O")) {
        Ok(ImageType::Auto) => ImageType::RAW,
        Ok(f) => f,
        Err(_) => return Err(CliError::Usage("Unknown file format".into())),
    };
    let (end, start) = copy_range(&ops, source.size());
    let out_size = start.map_or(0, |s| end - s);
    let create = CreateOptions {
        path: output.into(),
        format: out_format,
        size: out_size.next_multiple_of(512),
        sources: source.file_identities(),
        ..Default::default()
    };
    create_image(&create).map_err(|source| match source {
        // What the target cannot do, in qemu-img's words (the file is
        // named once).
        block::BlockError::CannotDo { reason, .. } => CliError::Usage(format!(
            "{output}: error while creating output image: {reason}"
        )),
        source => CliError::CreateOutput {
            path: output.into(),
            source,
        },
    })?;
    let target = open_image(output, out_format, false)?;
    let start = start.unwrap_or_else(|| {
        eprintln!("ch-img: {input}: cannot skip to specified offset");
        end
    });
    copy(&source, &target, start, end, ops.bs)?;
    target.close().map_err(CliError::Close)?;
    Ok(0)
}

/// Copies input bytes `start..end` to the output from offset 0, `bs`
/// bytes at a time.
fn copy(source: &ImageIo, target: &ImageIo, start: u64, end: u64, bs: u64) -> Result<(), CliError> {
    // Large blocks are moved in pieces of at most this many bytes (the
    // bytes written are the same).
    const PIECE: u64 = 4 << 20;
    let step = bs.min(PIECE);
    let mut buf = vec![0u8; step as usize];
    let mut pos = start;
    while pos < end {
        let n = (end - pos).min(step) as usize;
        source
            .read_at(pos, &mut buf[..n])
            .map_err(|source| CliError::Read {
                offset: pos,
                source,
            })?;
        let out = pos - start;
        target
            .write_at(out, &buf[..n])
            .map_err(|source| CliError::Write {
                offset: out,
                source,
            })?;
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(s: &str) -> Result<Operands, CliError> {
        let words: Vec<String> = s.split_whitespace().map(String::from).collect();
        parse_operands(&words)
    }

    #[test]
    fn operands_as_qemu_img_parses_them() {
        let o = ops("bs=1k bs=2k count=3 if=a if=b of=c skip=1.5k").unwrap();
        assert_eq!(
            o,
            Operands {
                bs: 2048,
                count: Some(3),
                skip: Some(1536),
                input: Some("b".into()),
                output: Some("c".into()),
            }
        );
        let msg = |s| match ops(s) {
            Err(CliError::Usage(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(msg("foo=1"), "unrecognized operand foo");
        assert_eq!(msg("extra"), "unrecognized operand extra");
        assert_eq!(
            msg("bs=0"),
            "Invalid bs specified. Must be between 1 and 2147483647."
        );
        assert_eq!(
            msg("bs=2G"),
            "Invalid bs specified. Must be between 1 and 2147483647."
        );
        assert!(msg("count=-1").starts_with("Invalid count specified. You may use"));
    }

    #[test]
    fn ranges_follow_qemu_img_arithmetic() {
        let m = 1 << 20;
        let range = |s: &str| copy_range(&ops(s).unwrap(), 10 * m);
        assert_eq!(range("bs=1M count=5 skip=2"), (5 * m, Some(2 * m)));
        assert_eq!(range("bs=1M skip=2"), (10 * m, Some(2 * m)));
        assert_eq!(range("bs=1M count=50"), (10 * m, Some(0)));
        assert_eq!(range("bs=1M skip=20"), (10 * m, None));
        assert_eq!(range("bs=1M count=5 skip=6"), (5 * m, None));
        assert_eq!(range("bs=1M count=5 skip=5"), (5 * m, Some(5 * m)));
        assert_eq!(range("bs=3000 count=7"), (21000, Some(0)));
        // Overflowing products count as "past the end".
        assert_eq!(range("bs=2147483647 skip=4E"), (10 * m, None));
    }
}
