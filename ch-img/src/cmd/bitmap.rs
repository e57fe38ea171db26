//! `ch-img bitmap (--merge SOURCE | --add | --remove | --clear | --enable
//! | --disable)... [-b SOURCE_FILE [-F SOURCE_FMT]] [-g GRANULARITY]
//! [-f FMT] FILENAME BITMAP`
//!
//! qemu-img 7.2's bitmap verb: the actions run in command-line order on
//! bitmap BITMAP of FILENAME's persistent dirty bitmaps, then the result
//! is stored at once ([`block::formats::PersistentBitmaps`]); an action
//! that fails stops them all and leaves the image as it was (qemu-img
//! keeps the actions before it). `--merge SOURCE` takes bitmap SOURCE of
//! the same image, or of `-b SOURCE_FILE` (opened read-only, format `-F`
//! or probed). The command line is checked as qemu-img checks it, with
//! its messages. The image is opened keeping its bitmaps valid
//! (`DiskOptions::keep_persistent_bitmaps`); nothing is printed on
//! success.

use block::formats::BitmapAction;
use block::options::CacheMode;
use block::BlockError;

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::options::{open_image_cached, open_image_keeping_bitmaps, parse_format};
use ch_util::size::parse_size;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "bFgf",
    short_flags: "h",
    long_with_value: &["merge"],
    long_flags: &["add", "remove", "clear", "enable", "disable"],
};

fn usage(message: &str) -> CliError {
    CliError::Usage(message.into())
}

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let granularity = p
        .value("g")
        .map(|g| {
            parse_size(g).ok().ok_or_else(|| {
                usage("Invalid granularity specified. You may use k, M, G, T, P or E suffixes for\nch-img: kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.")
            })
        })
        .transpose()?;
    let mut actions = Vec::new();
    for (name, value) in &p.opts {
        actions.push(match name.as_str() {
            "add" => BitmapAction::Add { granularity },
            "remove" => BitmapAction::Remove,
            "clear" => BitmapAction::Clear,
            "enable" => BitmapAction::Enable,
            "disable" => BitmapAction::Disable,
            "merge" => BitmapAction::Merge(value.clone().unwrap_or_default()),
            _ => continue,
        });
    }
    let has = |name: &str| actions.iter().any(|a| a.name() == name);
    if actions.is_empty() {
        return Err(usage(
            "Need at least one of --add, --remove, --clear, --enable, --disable, or --merge",
        ));
    }
    if granularity.is_some() && !has("add") {
        return Err(usage("granularity only supported with --add"));
    }
    if p.value("F").is_some() && p.value("b").is_none() {
        return Err(usage("-F only supported with -b"));
    }
    if p.value("b").is_some() && !has("merge") {
        return Err(usage(
            "Merge bitmap source file only supported with --merge",
        ));
    }
    let [path, bitmap] = p.operands.as_slice() else {
        return Err(usage("Expecting filename and bitmap name"));
    };
    let image =
        open_image_keeping_bitmaps(path, parse_format(p.value("f"))?, CacheMode::Writeback)?;
    if let Some(source_file) = p.value("b") {
        // --merge takes its sources from the other image: read them now.
        let source = open_image_cached(
            source_file,
            parse_format(p.value("F"))?,
            true,
            CacheMode::Writeback,
        )?;
        for action in &mut actions {
            if let BitmapAction::Merge(name) = action {
                let bits = source.tools().read_bitmap(name).map_err(|e| match e {
                    BlockError::Refused(m) => {
                        CliError::Usage(format!("Operation merge on bitmap {bitmap} failed: {m}"))
                    }
                    other => CliError::Bitmap(other),
                })?;
                *action = BitmapAction::MergeBits(name.clone(), bits);
            }
        }
    }
    image
        .tools()
        .change_bitmap(bitmap, &actions)
        .map_err(|e| match e {
            BlockError::Refused(m) | BlockError::CannotDo { reason: m, .. } => CliError::Usage(m),
            other => CliError::Bitmap(other),
        })?;
    image.close().map_err(CliError::Close)?;
    Ok(0)
}
