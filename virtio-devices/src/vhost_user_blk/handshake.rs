//! Connecting to a vhost-user-blk backend, at boot: SET_OWNER, the virtio
//! and protocol feature exchange, the queue count, and the config space.
//!
//! Enters as the socket path and the queue count the VMM wants; leaves as
//! a [`Connection`]: the open [`Frontend`], the virtio features the guest
//! may be offered, and the config space bytes (capacity, block size, ...)
//! with `num_queues` set to ours.

use std::path::Path;

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_CONFIG_WCE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_GEOMETRY, VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

use super::error::{request_failed, VhostUserBlkError};
use crate::block::config_space::offset;
use crate::block::features::bit;

/// The virtio features we pass through from the backend to the guest: the
/// split-ring features our transport implements and the virtio-blk ones.
/// Anything else the backend offers (packed rings, notification data,
/// IOMMU...) is not offered to the guest.
pub const ACCEPTED_FEATURES: u64 = bit(VIRTIO_F_VERSION_1)
    | bit(VIRTIO_RING_F_EVENT_IDX)
    | bit(VIRTIO_RING_F_INDIRECT_DESC)
    | bit(VIRTIO_BLK_F_SIZE_MAX)
    | bit(VIRTIO_BLK_F_SEG_MAX)
    | bit(VIRTIO_BLK_F_GEOMETRY)
    | bit(VIRTIO_BLK_F_RO)
    | bit(VIRTIO_BLK_F_BLK_SIZE)
    | bit(VIRTIO_BLK_F_FLUSH)
    | bit(VIRTIO_BLK_F_TOPOLOGY)
    | bit(VIRTIO_BLK_F_CONFIG_WCE)
    | bit(VIRTIO_BLK_F_MQ)
    | bit(VIRTIO_BLK_F_DISCARD)
    | bit(VIRTIO_BLK_F_WRITE_ZEROES);

/// The protocol features we use when the backend has them.
const WANTED_PROTOCOL: VhostUserProtocolFeatures =
    VhostUserProtocolFeatures::CONFIG.union(VhostUserProtocolFeatures::MQ);

/// An open, negotiated connection to a backend.
pub struct Connection {
    pub frontend: Frontend,
    /// The socket path, for messages.
    pub socket: String,
    /// What the guest may be offered: the backend's features we accept.
    pub guest_features: u64,
    /// `VHOST_USER_F_PROTOCOL_FEATURES`, acked with the guest's features.
    pub protocol_bit: u64,
    /// The virtio-blk config space the backend reported.
    pub config: Vec<u8>,
}

/// Connects to the backend at `socket` for a device with `num_queues`
/// queues and negotiates what the device needs.
pub fn connect(socket: &Path, num_queues: u16) -> Result<Connection, VhostUserBlkError> {
    let name = socket.display().to_string();
    let mut frontend = Frontend::connect(socket, u64::from(num_queues)).map_err(|source| {
        VhostUserBlkError::Connect {
            socket: name.clone(),
            source,
        }
    })?;
    let request = |request: &'static str| request_failed(&name, request);
    let missing = |what: &'static str| VhostUserBlkError::MissingFeature {
        socket: name.clone(),
        what,
    };
    frontend.set_owner().map_err(request("SET_OWNER"))?;
    let offered = frontend.get_features().map_err(request("GET_FEATURES"))?;
    let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if offered & protocol_bit == 0 {
        return Err(missing("VHOST_USER_F_PROTOCOL_FEATURES"));
    }
    if offered & bit(VIRTIO_F_VERSION_1) == 0 {
        return Err(missing("VIRTIO_F_VERSION_1"));
    }
    let protocol = frontend
        .get_protocol_features()
        .map_err(request("GET_PROTOCOL_FEATURES"))?;
    if !protocol.contains(VhostUserProtocolFeatures::CONFIG) {
        return Err(missing("the CONFIG protocol feature (GET_CONFIG)"));
    }
    let multi_queue = num_queues > 1;
    if multi_queue && !protocol.contains(VhostUserProtocolFeatures::MQ) {
        return Err(missing("the MQ protocol feature (more than one queue)"));
    }
    frontend
        .set_protocol_features(protocol & WANTED_PROTOCOL)
        .map_err(request("SET_PROTOCOL_FEATURES"))?;
    if protocol.contains(VhostUserProtocolFeatures::MQ) {
        let available = frontend.get_queue_num().map_err(request("GET_QUEUE_NUM"))?;
        if available < u64::from(num_queues) {
            return Err(VhostUserBlkError::TooFewQueues {
                socket: name,
                available,
                requested: num_queues,
            });
        }
    }
    let mut guest_features = offered & ACCEPTED_FEATURES;
    if multi_queue {
        if guest_features & bit(VIRTIO_BLK_F_MQ) == 0 {
            return Err(missing("VIRTIO_BLK_F_MQ"));
        }
    } else {
        guest_features &= !bit(VIRTIO_BLK_F_MQ);
    }
    let config = read_config(&mut frontend, &name, num_queues)?;
    log::info!(
        "vhost-user-blk {name}: backend features {offered:#x}, protocol {:#x}, guest offered {guest_features:#x}",
        protocol.bits()
    );
    Ok(Connection {
        frontend,
        socket: name,
        guest_features,
        protocol_bit,
        config,
    })
}

/// GET_CONFIG of the whole virtio-blk config space, with `num_queues`
/// replaced by the count this front end uses (it may use fewer than the
/// backend has).
fn read_config(
    frontend: &mut Frontend,
    socket: &str,
    num_queues: u16,
) -> Result<Vec<u8>, VhostUserBlkError> {
    let buf = vec![0u8; offset::END];
    let (_, mut config) = frontend
        .get_config(0, offset::END as u32, VhostUserConfigFlags::empty(), &buf)
        .map_err(request_failed(socket, "GET_CONFIG"))?;
    if let Some(field) = config.get_mut(offset::NUM_QUEUES..offset::NUM_QUEUES + 2) {
        field.copy_from_slice(&num_queues.to_le_bytes());
    }
    Ok(config)
}
