//! `ch-img snapshot [-l | -c NAME | -a NAME | -d NAME] [-f fmt] [-U] FILE`
//!
//! Lists a qcow2 image's internal snapshots as qemu-img does, from the
//! snapshot table the block crate parses (the image's
//! [`block::formats::ImageInfo::snapshots`]); the same table is what
//! `info` prints under "Snapshot list:" (human) and "snapshots" (JSON).
//! `-c` creates a snapshot, `-a` reverts the disk to the one with that id
//! or name, `-d` deletes the first one with that name
//! ([`block::formats::Snapshots::snapshot_create`], `snapshot_apply`,
//! `snapshot_delete`). A change that fails (ENOSPC, EIO) leaves the image
//! as it was ([`crate::image_io::ImageIo::undo_on_failure`]). An image
//! without internal snapshots (raw, an NBD export) is refused as qemu-img
//! 7.2 refuses it: `-c` with the errno, `-a` with the reason, `-d` as a
//! snapshot not found, `-l` lists nothing.

use block::formats::SnapshotInfo;
use block::BlockError;

use crate::args::{parse, OptSpec};
use crate::error::CliError;
use crate::options::{force_share, open_image, open_reader, parse_format, refuse_force_share};
use crate::size::human_size;
use block::options::CacheMode;

pub const SPEC: OptSpec = OptSpec {
    short_with_value: "facd",
    short_flags: "lqUh",
    long_with_value: &[],
    long_flags: &["force-share"],
};

pub fn run(args: &[String]) -> Result<u8, CliError> {
    let p = parse(args, &SPEC)?;
    let list = p.flag("l");
    let changes = ["a", "c", "d"]
        .iter()
        .filter(|o| p.value(o).is_some())
        .count();
    if changes + usize::from(list) > 1 {
        return Err(CliError::Usage("Cannot mix '-l', '-a', '-c', '-d'".into()));
    }
    let [path] = p.operands.as_slice() else {
        return Err(CliError::Usage("Expecting one image file name".into()));
    };
    let fmt = parse_format(p.value("f"))?;
    let shared = force_share(&p);
    let image = if changes == 0 {
        open_reader(path, fmt, CacheMode::Writeback, shared)?
    } else {
        refuse_force_share(path, shared)?;
        open_image(path, fmt, false)?
    };
    if let Some(name) = p.value("c") {
        let what = || format!("create snapshot '{name}'");
        // A failure puts the image back as it was.
        let result = image.undo_on_failure(|| {
            let created = image.tools().snapshot_create(name, now());
            created.map_err(|source| match source {
                BlockError::CannotDo { .. } => CliError::Usage(format!(
                    "Could not {}: {}",
                    what(),
                    crate::error::errno_message(&source)
                )),
                source => CliError::Snapshot {
                    what: what(),
                    source,
                },
            })
        });
        // Close (flush, clean) whatever happened; report the first error.
        let closed = image.close().map_err(|source| CliError::Snapshot {
            what: what(),
            source,
        });
        result.and(closed)?;
        return Ok(0);
    }
    for (opt, verb, missing) in [
        ("d", "delete", "snapshot not found"),
        (
            "a",
            "apply",
            "Failed to load snapshot: No such file or directory",
        ),
    ] {
        let Some(name) = p.value(opt) else { continue };
        let failed = |source| CliError::Snapshot {
            what: format!("{verb} snapshot '{name}'"),
            source,
        };
        let result = image.undo_on_failure(|| {
            if opt == "d" {
                match image.tools().snapshot_delete(name) {
                    // No snapshots at all: none by that name (qemu-img's
                    // answer).
                    Err(BlockError::CannotDo { .. }) => Ok(false),
                    other => other.map_err(failed),
                }
            } else {
                image.tools().snapshot_apply(name).map_err(|e| match e {
                    BlockError::CannotDo { reason, .. } => {
                        CliError::Usage(format!("Could not {verb} snapshot '{name}': {reason}"))
                    }
                    e => failed(e),
                })
            }
        });
        let closed = image.close().map_err(failed);
        let found = result.and_then(|found| closed.map(|()| found))?;
        if !found {
            return Err(CliError::Usage(format!(
                "Could not {verb} snapshot '{name}': {missing}"
            )));
        }
        return Ok(0);
    }
    // Like qemu-img 7.2, no action lists nothing.
    if list {
        let snapshots = image.format().info().snapshots;
        if !snapshots.is_empty() {
            print!("{}", snapshot_list(&snapshots));
        }
    }
    Ok(0)
}

/// qemu-img's "Snapshot list:" block: header and one row per snapshot.
pub fn snapshot_list(snapshots: &[SnapshotInfo]) -> String {
    let mut s = format!(
        "Snapshot list:\n{:<10}{:<17}{:>8}{:>20}{:>13}{:>11}\n",
        "ID", "TAG", "VM SIZE", "DATE", "VM CLOCK", "ICOUNT"
    );
    for sn in snapshots {
        let secs = sn.vm_clock_nsec / 1_000_000_000;
        let clock = format!(
            "{:02}:{:02}:{:02}.{:03}",
            secs / 3600,
            (secs / 60) % 60,
            secs % 60,
            (sn.vm_clock_nsec / 1_000_000) % 1000
        );
        let icount = sn.icount.map(|c| c.to_string()).unwrap_or_default();
        s.push_str(&format!(
            "{:<9} {:<16} {:>8}{:>20}{:>13}{:>11}\n",
            sn.id,
            sn.name,
            human_size(sn.vm_state_size),
            local_date(sn.date_sec),
            clock,
            icount
        ));
    }
    s
}

/// Now, as (seconds, nanoseconds) since the epoch, to the microsecond as
/// qemu-img records it.
fn now() -> (u32, u32) {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_secs() as u32, t.subsec_micros() * 1000)
}

/// `YYYY-MM-DD HH:MM:SS` in local time, as qemu-img prints dates.
fn local_date(secs: u32) -> String {
    let t = libc::time_t::from(secs);
    // SAFETY: `tm` is plain data that localtime_r fills; both pointers are
    // valid for the call.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return secs.to_string();
        }
        tm
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}
