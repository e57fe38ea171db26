//! The HTTP API (`--api-socket`): Cloud Hypervisor's REST API on a Unix
//! socket, for the endpoints this VMM implements (docs/api.md).
//!
//! Flow: the server thread ([`server`]) accepts a connection and gives it
//! a thread of its own (a few at most); that thread reads one HTTP/1.1
//! request with deadlines and size limits ([`http`]), turns it into an
//! [`ApiRequest`] ([`routes`], bodies in [`types`]) and sends it to the
//! VMM's control loop as an [`ApiMessage`], waking the loop through an
//! eventfd. It then waits for the [`ApiResponse`], writes it and closes
//! the connection. The API threads never touch a device, an image or the
//! vCPUs, and hold no lock the request path takes: everything happens in
//! the control loop (`crate::control`), one request at a time.

pub mod client;
pub mod http;
pub mod routes;
mod server;
pub mod socket;
pub mod types;

use std::sync::mpsc::{Receiver, Sender, SyncSender};

use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

pub use server::ApiServer;

/// What a client asked for, checked and parsed.
#[derive(Debug)]
pub enum ApiRequest {
    VmmPing,
    VmmShutdown,
    VmInfo,
    VmCounters,
    VmPause,
    VmResume,
    VmShutdown,
    VmReboot,
    /// A size below the current one is refused unless `shrink` is set.
    VmResizeDisk {
        id: String,
        desired_size: u64,
        shrink: bool,
    },
    VmAddDisk(Box<crate::config::DiskConfig>),
    VmRemoveDevice {
        id: String,
    },
    VmSnapshotDisk {
        id: String,
        name: String,
    },
    VmDiskInfo {
        id: String,
    },
}

/// An HTTP status and an optional JSON body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiResponse {
    pub status: u16,
    pub body: Option<String>,
}

impl ApiResponse {
    pub fn no_content() -> Self {
        ApiResponse {
            status: 204,
            body: None,
        }
    }

    /// 200 with `value` as the JSON body.
    pub fn json(value: &impl Serialize) -> Self {
        match serde_json::to_string(value) {
            Ok(body) => ApiResponse {
                status: 200,
                body: Some(body),
            },
            Err(e) => Self::error(500, &["cannot encode the answer", &e.to_string()]),
        }
    }

    /// An error: `status` and, as Cloud Hypervisor does, the error chain
    /// as a JSON array of strings (outermost first).
    pub fn error(status: u16, chain: &[&str]) -> Self {
        ApiResponse {
            status,
            body: Some(serde_json::to_string(chain).unwrap_or_else(|_| "[]".into())),
        }
    }

    /// An error from an error value and its sources.
    pub fn from_error(status: u16, e: &(dyn std::error::Error + 'static)) -> Self {
        Self::from_error_in(status, None, e)
    }

    /// An error from what failed (`what`), the error and its sources.
    pub fn from_error_in(
        status: u16,
        what: Option<&str>,
        e: &(dyn std::error::Error + 'static),
    ) -> Self {
        let mut chain: Vec<String> = what.map(str::to_string).into_iter().collect();
        chain.push(e.to_string());
        let mut cur = e.source();
        while let Some(s) = cur {
            chain.push(s.to_string());
            cur = s.source();
        }
        let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
        Self::error(status, &refs)
    }
}

/// A request on its way to the control loop, with where to answer.
pub struct ApiMessage {
    pub request: ApiRequest,
    pub reply: SyncSender<ApiResponse>,
}

/// The control loop's end: messages and the eventfd that says some are
/// waiting.
pub struct ApiReceiver {
    pub messages: Receiver<ApiMessage>,
    pub wake: EventFd,
}

/// The API threads' end.
#[derive(Clone)]
pub struct ApiSender {
    messages: Sender<ApiMessage>,
    wake: std::sync::Arc<EventFd>,
}

impl ApiSender {
    /// Sends `request` and waits for the answer (503 if the control loop
    /// is gone or does not answer within `timeout`).
    pub fn call(&self, request: ApiRequest, timeout: std::time::Duration) -> ApiResponse {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let gone = || ApiResponse::error(503, &["the VMM is shutting down"]);
        if self.messages.send(ApiMessage { request, reply }).is_err() {
            return gone();
        }
        if let Err(e) = self.wake.write(1) {
            log::error!("api: cannot wake the control loop: {e}");
        }
        match answer.recv_timeout(timeout) {
            Ok(r) => r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => ApiResponse::error(
                503,
                &[&format!("the VMM did not answer within {timeout:?}")],
            ),
            Err(_) => gone(),
        }
    }
}

/// A connected pair of ends.
pub fn channel() -> std::io::Result<(ApiReceiver, ApiSender)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let wake = EventFd::new(libc::EFD_NONBLOCK)?;
    let sender = ApiSender {
        messages: tx,
        wake: std::sync::Arc::new(wake.try_clone()?),
    };
    Ok((ApiReceiver { messages: rx, wake }, sender))
}
