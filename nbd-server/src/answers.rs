//! The answer to a request the block layer failed, shared by every
//! command (`crate::commands`, `crate::block_status`) and by the storage
//! daemon's test that holds virtio-blk, FUSE and NBD to one answer for
//! every kind of block error.

use block::BlockError;
use nbd::wire::nbd_error_from_errno;

/// The answer to a request that failed in the block layer, as FUSE and
/// virtio-blk answer it: logged through the block crate's one log of
/// failed requests (at the error's level, rate-limited;
/// [`block::error_log`]), answered with the protocol's number for the
/// error's errno ([`BlockError::errno`]: the host's own where there is
/// one).
pub fn answer_block_error(request: std::fmt::Arguments<'_>, e: &BlockError) -> u32 {
    block::error_log::log_failed_request(request, e);
    nbd_error_from_errno(e.errno())
}
