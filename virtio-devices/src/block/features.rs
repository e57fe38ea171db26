//! virtio-blk feature bits: which ones the device offers for a given disk.
//!
//! Data enters as the disk's properties (read-only, queue count) and leaves
//! as the 64-bit feature word the transport offers to the driver.

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// The bit for feature number `n`.
pub const fn bit(n: u32) -> u64 {
    1u64 << n
}

/// Features offered for a disk. A read-only disk offers RO instead of
/// DISCARD and WRITE_ZEROES; MQ is offered only with more than one queue.
pub fn offered_features(readonly: bool, num_queues: u16) -> u64 {
    let mut features = bit(VIRTIO_F_VERSION_1)
        | bit(VIRTIO_RING_F_EVENT_IDX)
        | bit(VIRTIO_RING_F_INDIRECT_DESC)
        | bit(VIRTIO_BLK_F_SEG_MAX)
        | bit(VIRTIO_BLK_F_BLK_SIZE)
        | bit(VIRTIO_BLK_F_TOPOLOGY)
        | bit(VIRTIO_BLK_F_FLUSH)
        | bit(VIRTIO_BLK_F_CONFIG_WCE);
    if num_queues > 1 {
        features |= bit(VIRTIO_BLK_F_MQ);
    }
    if readonly {
        features |= bit(VIRTIO_BLK_F_RO);
    } else {
        features |= bit(VIRTIO_BLK_F_DISCARD) | bit(VIRTIO_BLK_F_WRITE_ZEROES);
    }
    features
}

/// Whether the driver negotiated EVENT_IDX (used and avail event fields).
pub fn has_event_idx(acked: u64) -> bool {
    acked & bit(VIRTIO_RING_F_EVENT_IDX) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_disk_offers_ro_and_no_discard() {
        let f = offered_features(true, 1);
        assert_ne!(f & bit(VIRTIO_BLK_F_RO), 0);
        assert_eq!(f & bit(VIRTIO_BLK_F_DISCARD), 0);
        assert_eq!(f & bit(VIRTIO_BLK_F_WRITE_ZEROES), 0);
        assert_eq!(f & bit(VIRTIO_BLK_F_MQ), 0);
    }

    #[test]
    fn writable_multiqueue_disk_offers_discard_and_mq() {
        let f = offered_features(false, 4);
        assert_eq!(f & bit(VIRTIO_BLK_F_RO), 0);
        assert_ne!(f & bit(VIRTIO_BLK_F_DISCARD), 0);
        assert_ne!(f & bit(VIRTIO_BLK_F_WRITE_ZEROES), 0);
        assert_ne!(f & bit(VIRTIO_BLK_F_MQ), 0);
        assert_ne!(f & bit(VIRTIO_F_VERSION_1), 0);
        assert!(has_event_idx(f));
    }
}
