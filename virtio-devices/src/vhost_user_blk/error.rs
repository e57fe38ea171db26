//! Why talking to a vhost-user-blk backend failed: the error the
//! handshake, the vrings and the device share, and the `map_err` helper
//! for a failed request to the backend.

use std::io;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum VhostUserBlkError {
    #[error("cannot connect to the vhost-user socket {socket}")]
    Connect {
        socket: String,
        #[source]
        source: vhost::Error,
    },
    #[error("vhost-user {request} to {socket} failed")]
    Request {
        socket: String,
        request: &'static str,
        #[source]
        source: vhost::Error,
    },
    #[error("the vhost-user backend at {socket} does not offer {what}")]
    MissingFeature { socket: String, what: &'static str },
    #[error("the vhost-user backend at {socket} has {available} queue(s), {requested} asked for")]
    TooFewQueues {
        socket: String,
        available: u64,
        requested: u16,
    },
    #[error("guest memory at {0:#x} is not in a shareable file (use --memory shared=on)")]
    MemoryNotShared(u64),
    #[error("guest memory has {0} regions, more than vhost-user can send")]
    TooManyRegions(usize),
    #[error("queue {index}: ring address {addr:#x} is not in guest memory")]
    RingAddress { index: u16, addr: u64 },
    #[error("cannot set up the call eventfds and their forwarding thread")]
    CallForwarder(#[source] io::Error),
}

/// For `map_err`: message `request` to the backend at `socket` failed.
pub(crate) fn request_failed(
    socket: &str,
    request: &'static str,
) -> impl FnOnce(vhost::Error) -> VhostUserBlkError {
    let socket = socket.to_string();
    move |source| VhostUserBlkError::Request {
        socket,
        request,
        source,
    }
}
