//! NBD_CMD_BLOCK_STATUS: one chunk per context the client selected, in
//! the session's order (`base:allocation` first, then the bitmaps), the
//! last one marked done, as QEMU's server answers.
//!
//! - `base:allocation` is the source's allocation status (holes and
//!   zeroes), read inline and merged into extents;
//! - `qemu:dirty-bitmap:NAME` is the bitmap's dirty and clean runs
//!   ([`crate::bitmap::dirty_extents`]).
//!
//! Each chunk covers at most the requested range and ends early when it
//! reaches [`MAX_EXTENTS`] (or one extent with `REQ_ONE`); the client asks
//! again from where it ends. A failure of the source's status ends the
//! answer with an error chunk.

use nbd::outbox::Outbox;
use nbd::server::{replies, MetaContext, Request};
use nbd::wire::consts::{cmd_flag, error, state};

use crate::answers::answer_block_error;
use crate::bitmap::dirty_extents;
use crate::shared::ExportShared;

/// Most extents in one chunk (QEMU's server sends at most 1 MiB of
/// them).
pub const MAX_EXTENTS: usize = 1 << 17;

/// Answers `req` (validated: inside the export, length above 0) for the
/// selected `contexts`.
pub fn answer(
    shared: &ExportShared,
    contexts: &[MetaContext],
    structured: bool,
    req: &Request,
    out: &mut Outbox,
) {
    let max = if req.has(cmd_flag::REQ_ONE) {
        1
    } else {
        MAX_EXTENTS
    };
    for (i, context) in contexts.iter().enumerate() {
        let extents = match context {
            MetaContext::BaseAllocation => match allocation(shared, req, max) {
                Ok(e) => e,
                Err((code, msg)) => {
                    out.push_with(|b| replies::error(b, structured, req.cookie, code, &msg));
                    return;
                }
            },
            MetaContext::DirtyBitmap(n) => {
                let bitmap = &shared.bitmaps[*n as usize].bitmap;
                dirty_extents(bitmap.as_ref(), req.offset, req.len, max)
            }
        };
        let done = i + 1 == contexts.len();
        out.push_with(|b| replies::block_status_part(b, req.cookie, context.id(), &extents, done));
    }
}

/// `base:allocation` extents; the error is (NBD error, message).
fn allocation(
    shared: &ExportShared,
    req: &Request,
    max: usize,
) -> Result<Vec<(u32, u32)>, (u32, String)> {
    let mut extents: Vec<(u32, u32)> = Vec::new();
    let (mut at, end) = (req.offset, req.offset + u64::from(req.len));
    while at < end {
        let st = match shared.source.allocation(at, end - at) {
            Ok(st) if st.len > 0 => st,
            Ok(_) => break,
            Err(e) => {
                let cookie = req.cookie;
                let code = answer_block_error(
                    format_args!("nbd: request {cookie:#x} (block status at {at})"),
                    &e,
                );
                return Err((code, format!("block status at {at}: {e}")));
            }
        };
        let flags =
            (if st.data { 0 } else { state::HOLE }) | (if st.zero { state::ZERO } else { 0 });
        let len = st.len.min(end - at) as u32;
        let full = extents.len() >= max;
        match extents.last_mut() {
            Some((l, f)) if *f == flags => *l += len,
            _ if full => break,
            _ => extents.push((len, flags)),
        }
        at += u64::from(len);
    }
    if extents.is_empty() {
        return Err((error::EIO, "no block status".to_string()));
    }
    Ok(extents)
}
