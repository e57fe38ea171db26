//! `ch-img map [-f fmt] [--output=human|json] [--start-offset=OFFSET]
//! [--max-length=LEN] FILE`
//!
//! Walks the virtual disk (or the range asked for) with
//! [`block::formats::Format::block_status`], merges neighbouring extents
//! as qemu-img does (same flags, same depth, same file, host offsets
//! contiguous) and prints them.

use std::fmt::Write as _;

use block::formats::BlockStatus;

use crate::args::{parse, OptSpec};
use crate::cmd::OutputFormat;
use crate::error::CliError;
use crate::image_io::ImageIo;
use crate::options::{force_share, open_reader, parse_format};
use block::options::CacheMode;
use ch_util::size::parse_size;

const SUFFIX_HINT: &str = "You may use k, M, G, T, P or E suffixes for kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.";

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "f",
    short_flags: "Uqh",
    long_with_value: &["output", "start-offset", "max-length"],
    long_flags: &["force-share"],
};

/// One merged extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub status: BlockStatus,
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let output = OutputFormat::parse(p.value("output"))?;
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let range_value = |name: &str, what: &str| -> Result<Option<u64>, CliError> {
        p.value(name)
            .map(|v| {
                parse_size(v).ok().ok_or_else(|| {
                    CliError::Usage(format!("Invalid {what} specified. {SUFFIX_HINT}"))
                })
            })
            .transpose()
    };
    let start = range_value("start-offset", "start offset")?.unwrap_or(0);
    let max_len = range_value("max-length", "max length")?;
    let shared = force_share(&p);
    let image = open_reader(
        path,
        parse_format(p.value("f"))?,
        CacheMode::Writeback,
        shared,
    )?;
    let end = max_len.map_or(u64::MAX, |l| start.saturating_add(l));
    let end = end.min(image.size());
    let mut entries = map_range(&image, start, end)?;
    if entries.is_empty() {
        // qemu-img's answer for an empty range: one empty extent.
        entries.push(MapEntry {
            start,
            status: BlockStatus {
                len: 0,
                depth: 0,
                present: false,
                zero: false,
                data: false,
                compressed: false,
                offset: None,
                file: None,
            },
        });
    }
    let names = chain_names(path, &image);
    let (text, complete) = match output {
        OutputFormat::Json => (json_map(&entries), true),
        OutputFormat::Human => human_map(&entries, &names),
    };
    print!("{text}");
    if !complete {
        return Err(CliError::NotMappable);
    }
    Ok(0)
}

/// The merged extents covering `start..end` (none when it is empty).
pub fn map_range(image: &ImageIo, start: u64, end: u64) -> Result<Vec<MapEntry>, CliError> {
    let size = end.min(image.size());
    let mut out: Vec<MapEntry> = Vec::new();
    let mut pos = start;
    while pos < size {
        let status = image.extent_at(pos, size)?;
        let len = status.len;
        match out.last_mut() {
            Some(prev) if mergeable(prev, &status) => prev.status.len += len,
            _ => out.push(MapEntry { start: pos, status }),
        }
        pos += len;
    }
    Ok(out)
}

fn mergeable(prev: &MapEntry, next: &BlockStatus) -> bool {
    let a = &prev.status;
    let offsets_follow = match (a.offset, next.offset) {
        (None, None) => true,
        (Some(x), Some(y)) => x.checked_add(a.len) == Some(y),
        _ => false,
    };
    a.depth == next.depth
        && a.present == next.present
        && a.zero == next.zero
        && a.data == next.data
        && a.compressed == next.compressed
        && a.file == next.file
        && offsets_follow
}

/// qemu-img map's JSON: one object per line inside a list.
pub fn json_map(entries: &[MapEntry]) -> String {
    let mut s = String::from("[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            s.push_str(",\n");
        }
        let st = &e.status;
        let _ = write!(
            s,
            "{{ \"start\": {}, \"length\": {}, \"depth\": {}, \"present\": {}, \"zero\": {}, \"data\": {}",
            e.start, st.len, st.depth, st.present, st.zero, st.data
        );
        if let Some(o) = st.offset {
            let _ = write!(s, ", \"offset\": {o}");
        }
        s.push('}');
    }
    s.push_str("]\n");
    s
}

/// qemu-img map's table: extents that hold data (not reading as zero) at
/// a known host offset. Like qemu-img, the table stops at the first data
/// extent without a host offset (a compressed cluster): the bool is false
/// then, and the verb fails.
pub fn human_map(entries: &[MapEntry], names: &[String]) -> (String, bool) {
    let mut s = format!(
        "{:<16}{:<16}{:<16}{}\n",
        "Offset", "Length", "Mapped to", "File"
    );
    for e in entries {
        let st = &e.status;
        if !st.data || st.zero {
            continue;
        }
        let Some(offset) = st.offset else {
            return (s, false);
        };
        let name = names
            .get(st.depth as usize)
            .map(String::as_str)
            .unwrap_or("?");
        let _ = writeln!(
            s,
            "{:<16}{:<16}{:<16}{}",
            hex(e.start),
            hex(st.len),
            hex(offset),
            name
        );
    }
    (s, true)
}

fn hex(v: u64) -> String {
    if v == 0 {
        "0".into()
    } else {
        format!("{v:#x}")
    }
}

/// The file names of the chain, top first: the image as given, then each
/// backing file as its overlay names it (resolved); an NBD export as
/// QEMU names it ([`block::engines::nbd::qemu_filename`]).
fn chain_names(path: &str, image: &ImageIo) -> Vec<String> {
    let mut names = vec![block::engines::nbd::qemu_filename(path)];
    let mut info = image.format().info();
    // Bounded: a looping chain cannot be opened in the first place.
    while let Some(next) = info.full_backing_filename.clone() {
        if names.len() > 64 {
            break;
        }
        names.push(block::engines::nbd::qemu_filename(&next));
        match open_reader(&next, block::ImageType::Auto, CacheMode::Writeback, true) {
            Ok(img) => info = img.format().info(),
            Err(_) => break,
        }
    }
    names
}
