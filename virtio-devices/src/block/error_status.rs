//! How a failed block request is answered and logged.
//!
//! A [`BlockError`] says what it means ([`block::Consequence`]); here that
//! becomes the virtio-blk status byte (UNSUPP for what is not offered,
//! IOERR for everything else). The failure is logged through the block
//! crate's one rate-limited log of failed requests
//! ([`block::error_log`]), which the storage daemon's exports share.

use block::BlockError;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP};

/// The status byte for a request that failed with `e`, after logging it.
pub fn failed_request_status(queue: u16, user_data: u64, e: &BlockError) -> u8 {
    block::error_log::log_failed_request(
        format_args!("virtio-blk queue {queue}: request {user_data:#x}"),
        e,
    );
    status_of(e)
}

/// UNSUPP for what is not offered, IOERR for everything else.
pub fn status_of(e: &BlockError) -> u8 {
    if e.is_unsupported() {
        VIRTIO_BLK_S_UNSUPP as u8
    } else {
        VIRTIO_BLK_S_IOERR as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        let unsupp = BlockError::Unsupported {
            path: "x".into(),
            feature: "y".into(),
        };
        assert_eq!(status_of(&unsupp), VIRTIO_BLK_S_UNSUPP as u8);
        assert_eq!(status_of(&BlockError::ReadOnly), VIRTIO_BLK_S_IOERR as u8);
    }
}
