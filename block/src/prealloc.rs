//! Preallocation modes (qemu-img's `preallocation=`) and the file-level
//! work they do: reserve a range with fallocate, or write zeroes over it.
//!
//! [`Preallocation`] enters from `ch-img create -o`, `resize
//! --preallocation` and `convert -o`; [`preallocate_range`] runs the data
//! part for raw files and for qcow2's data area. Errors leave as
//! [`BlockError::Preallocate`], naming the mode and the errno (ENOSPC,
//! EOPNOTSUPP, ...) as qemu-img does.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::str::FromStr;

use crate::error::BlockError;
use crate::formats::{Format, HostWrite, WriteOutcome};

/// How much of a new image (or a grown area) is allocated up front.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Preallocation {
    /// Nothing: a sparse file (raw) or only the header structures (qcow2).
    #[default]
    Off,
    /// qcow2 only: every L2 table and data cluster allocated in the
    /// metadata, the file extended sparsely over them.
    Metadata,
    /// As `metadata` (qcow2), with the data area reserved by fallocate.
    Falloc,
    /// As `metadata` (qcow2), with zeroes written over the data area.
    Full,
}

impl Preallocation {
    pub fn as_str(self) -> &'static str {
        match self {
            Preallocation::Off => "off",
            Preallocation::Metadata => "metadata",
            Preallocation::Falloc => "falloc",
            Preallocation::Full => "full",
        }
    }
}

impl fmt::Display for Preallocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Preallocation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Preallocation::Off),
            "metadata" => Ok(Preallocation::Metadata),
            "falloc" => Ok(Preallocation::Falloc),
            "full" => Ok(Preallocation::Full),
            _ => Err(format!(
                "Invalid value '{s}' for option 'preallocation' (off, metadata, falloc or full)"
            )),
        }
    }
}

/// Zeroes written per call by `full`.
const ZERO_CHUNK: usize = 1 << 20;

/// The errno's symbolic name for messages (qemu-img names ENOSPC).
pub fn errno_name(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => "ENOSPC",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        Some(libc::EDQUOT) => "EDQUOT",
        Some(libc::EFBIG) => "EFBIG",
        Some(libc::EIO) => "EIO",
        Some(libc::EINVAL) => "EINVAL",
        _ => "error",
    }
}

/// The error for a failed preallocation of `path`.
pub fn prealloc_error(path: &Path, mode: Preallocation, source: io::Error) -> BlockError {
    BlockError::Preallocate {
        path: path.to_owned(),
        mode: mode.as_str(),
        errno: errno_name(&source),
        source,
    }
}

/// Allocates `offset..offset+len` of `file` as `mode` says: `falloc`
/// reserves it with fallocate(2) (no fallback: a file system without
/// fallocate fails with EOPNOTSUPP, as qemu-img does), `full` writes
/// zeroes, `off`/`metadata` only extend the file to the range's end.
pub fn preallocate_range(
    file: &File,
    path: &Path,
    mode: Preallocation,
    offset: u64,
    len: u64,
) -> Result<(), BlockError> {
    let fail = |e| prealloc_error(path, mode, e);
    let end = offset
        .checked_add(len)
        .ok_or_else(|| fail(io::Error::from_raw_os_error(libc::EFBIG)))?;
    match mode {
        Preallocation::Off | Preallocation::Metadata => {
            if file.metadata().map_err(fail)?.len() < end {
                file.set_len(end).map_err(fail)?;
            }
        }
        Preallocation::Falloc => {
            if len > 0 {
                fallocate(file, offset, len).map_err(fail)?;
            }
        }
        Preallocation::Full => {
            let zeroes = vec![0u8; ZERO_CHUNK];
            let mut pos = offset;
            while pos < end {
                let n = (end - pos).min(ZERO_CHUNK as u64) as usize;
                file.write_all_at(&zeroes[..n], pos).map_err(fail)?;
                pos += n as u64;
            }
        }
    }
    Ok(())
}

/// Guest bytes planned per step of [`preallocate_grown`].
const GROW_STEP: u64 = 16 << 20;

/// Preallocates the area `old_size..new_size` that a resize just added to
/// `format` (`ch-img resize --preallocation`). Raw: the file range as
/// [`preallocate_range`] does (`metadata` is refused). qcow2: every
/// cluster of the area is allocated through the format's own write path
/// (so refcounts, L2 tables and the overlap checks are the ones guest
/// writes use) and, instead of guest data, its host range is left sparse
/// (`metadata`, the file then extended over it), fallocated (`falloc`) or
/// written with zeroes (`full`) before the L2 entries are published.
pub fn preallocate_grown(
    format: &dyn Format,
    path: &Path,
    mode: Preallocation,
    old_size: u64,
    new_size: u64,
) -> Result<(), BlockError> {
    if mode == Preallocation::Off || new_size <= old_size {
        return Ok(());
    }
    let files = format.files().local();
    let Some(image) = files.first() else {
        return Ok(());
    };
    if format.name() == "raw" {
        if mode == Preallocation::Metadata {
            return Err(BlockError::InvalidImage {
                path: path.to_owned(),
                reason: "preallocation=metadata is for qcow2; raw images take off, falloc or full"
                    .into(),
            });
        }
        return preallocate_range(image, path, mode, old_size, new_size - old_size);
    }
    let waker = std::sync::Arc::new(
        vmm_sys_util::eventfd::EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK)
            .map_err(BlockError::EventFd)?,
    );
    let mut end_of_data = 0u64;
    let mut pos = old_size;
    while pos < new_size {
        let len = (new_size - pos).min(GROW_STEP);
        let plan = match format.plan_write(pos, len, &waker)? {
            WriteOutcome::Ready(plan) => plan,
            WriteOutcome::Blocked => {
                return Err(BlockError::Resize(
                    "preallocation: the grown area is busy".into(),
                ))
            }
        };
        let mut result = Ok(());
        for op in &plan.ops {
            let (file, offset, len) = match op {
                HostWrite::Data {
                    file,
                    offset,
                    parts,
                } => (*file, *offset, parts.iter().map(|p| p.len()).sum::<u64>()),
                HostWrite::ZeroRange { file, offset, len } => (*file, *offset, *len),
                HostWrite::PunchHole { .. } => continue,
            };
            let Some(f) = files.get(usize::from(file.0)) else {
                continue;
            };
            end_of_data = end_of_data.max(offset.saturating_add(len));
            let step = if mode == Preallocation::Metadata {
                Ok(())
            } else {
                preallocate_range(f, path, mode, offset, len)
            };
            if let Err(e) = step {
                result = Err(e);
                break;
            }
        }
        match (result, plan.commit) {
            (Ok(()), Some(c)) => format.commit(c)?,
            (Err(e), Some(c)) => {
                format.abort(c);
                return Err(e);
            }
            (r, None) => r?,
        }
        pos += len;
    }
    if mode == Preallocation::Metadata {
        preallocate_range(image, path, mode, 0, end_of_data)?;
    }
    format.flush_metadata()
}

fn fallocate(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    let len = i64::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain syscall on a descriptor `file` keeps open; no memory.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, off, len) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_qemu_names_only() {
        for m in ["off", "metadata", "falloc", "full"] {
            assert_eq!(m.parse::<Preallocation>().unwrap().as_str(), m);
        }
        let e = "sparse".parse::<Preallocation>().unwrap_err();
        assert!(e.contains("'sparse'") && e.contains("falloc"), "{e}");
    }

    #[test]
    fn the_error_names_enospc() {
        let e = prealloc_error(
            Path::new("x"),
            Preallocation::Full,
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        let msg = e.to_string();
        assert!(msg.contains("ENOSPC") && msg.contains("full"), "{msg}");
    }
}
