//! Runs a format's populate plan ([`crate::formats::Format::plan_populate`])
//! on the calling thread: a stream job's copy of backing data into the
//! clusters of the running image that are still unallocated.
//!
//! The format decides under its metadata lock which clusters are still
//! unallocated and registers the ones it allocates in flight (a guest
//! write to them waits until the commit here, then writes over them in
//! place); this module writes the plan's data with `pwrite` on the
//! image's own descriptors (from an aligned buffer, so O_DIRECT files
//! take it), then commits the plan (or aborts it when a write failed:
//! the clusters are given back, nothing points at them). Data enters as
//! a guest range and its bytes; the bytes populated leave.
//!
//! By hand, not on a queue: a populate is not a guest request (no
//! request op, no dirty bitmap marks a write that changes nothing the
//! guest reads), and a job runs one at a time.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use block_engines::aligned::AlignedBuf;

use crate::error::BlockError;
use crate::formats::{Format, HostWrite, Waker, WriteData, WriteOutcome};

/// How long a populate waits for guest writes that are allocating the
/// same clusters (each takes a moment) before it gives up.
const BLOCKED_FOR: Duration = Duration::from_secs(30);

/// Writes `data` at guest `offset` into the clusters of `format` that are
/// still unallocated; returns the bytes written (the rest the guest had
/// allocated first).
pub fn populate(
    format: &dyn Format,
    offset: u64,
    data: &[u8],
    waker: &Waker,
) -> Result<u64, BlockError> {
    let len = data.len() as u64;
    let since = Instant::now();
    let plan = loop {
        match format.plan_populate(offset, len, waker)? {
            WriteOutcome::Ready(plan) => break plan,
            WriteOutcome::Blocked if since.elapsed() < BLOCKED_FOR => {
                std::thread::sleep(Duration::from_micros(200));
            }
            WriteOutcome::Blocked => {
                return Err(BlockError::Refused(format!(
                    "populating {len} bytes at {offset}: guest writes kept the clusters busy"
                )))
            }
        }
    };
    let mut written = 0;
    let mut result = Ok(());
    for op in &plan.ops {
        result = write_op(format, op, data, &mut written);
        if result.is_err() {
            break;
        }
    }
    match (result, plan.commit) {
        (Ok(()), Some(c)) => format.commit(c)?,
        (Ok(()), None) => {}
        (Err(e), Some(c)) => {
            format.abort(c);
            return Err(e);
        }
        (Err(e), None) => return Err(e),
    }
    Ok(written)
}

/// Runs one host op of the plan; counts the request bytes it wrote.
fn write_op(
    format: &dyn Format,
    op: &HostWrite,
    data: &[u8],
    written: &mut u64,
) -> Result<(), BlockError> {
    let (file, host, parts) = match op {
        HostWrite::Data {
            file,
            offset,
            parts,
        } => (*file, *offset, parts.clone()),
        HostWrite::ZeroRange { file, offset, len } => {
            (*file, *offset, vec![WriteData::Zeroes(*len)])
        }
        // A hint; a fresh cluster has nothing to punch.
        HostWrite::PunchHole { .. } => return Ok(()),
    };
    let files = format.files();
    let Some(f) = files.local().get(usize::from(file.0)) else {
        return Err(BlockError::Unsupported {
            path: Default::default(),
            feature: "populating an image whose data lives on a remote file".into(),
        });
    };
    let total: u64 = parts.iter().map(WriteData::len).sum();
    let mut buf = AlignedBuf::new(total as usize, 4096)
        .ok_or_else(|| BlockError::Refused(format!("no memory for a buffer of {total} bytes")))?;
    let out = buf.as_mut_slice();
    let mut at = 0usize;
    for part in &parts {
        let n = part.len() as usize;
        match part {
            WriteData::Request { offset, len } => {
                let src = data
                    .get(*offset as usize..(*offset + *len) as usize)
                    .ok_or(BlockError::OutOfRange {
                        offset: *offset,
                        len: *len,
                        size: data.len() as u64,
                    })?;
                out[at..at + n].copy_from_slice(src);
                *written += *len;
            }
            WriteData::Owned(v) => out[at..at + n].copy_from_slice(v),
            WriteData::Zeroes(_) => out[at..at + n].fill(0),
        }
        at += n;
    }
    f.write_all_at(buf.as_slice(), host)
        .map_err(|source| BlockError::Write {
            offset: host,
            source,
        })
}
