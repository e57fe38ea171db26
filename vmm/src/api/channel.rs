//! The channel between the API threads and the VMM's control loop: an
//! [`ApiSender`] (cloned into each connection thread) sends an
//! [`ApiMessage`] and wakes the loop through an eventfd; the loop's
//! [`ApiReceiver`] takes the messages and answers each through its reply
//! channel. [`channel`] makes a connected pair.

use std::sync::mpsc::{Receiver, Sender, SyncSender};

use vmm_sys_util::eventfd::EventFd;

use super::endpoint;
use super::response::ApiResponse;

/// A request on its way to the control loop, with where to answer.
pub struct ApiMessage<C> {
    /// The endpoint's name, for the log.
    pub name: &'static str,
    pub job: endpoint::Job<C>,
    pub reply: SyncSender<ApiResponse>,
}

/// The control loop's end: messages and the eventfd that says some are
/// waiting.
pub struct ApiReceiver<C> {
    pub messages: Receiver<ApiMessage<C>>,
    pub wake: EventFd,
}

/// The API threads' end.
pub struct ApiSender<C> {
    messages: Sender<ApiMessage<C>>,
    wake: std::sync::Arc<EventFd>,
}

impl<C> Clone for ApiSender<C> {
    fn clone(&self) -> Self {
        ApiSender {
            messages: self.messages.clone(),
            wake: self.wake.clone(),
        }
    }
}

impl<C> ApiSender<C> {
    /// Sends `job` and waits for the answer (503 if the control loop is
    /// gone or does not answer within `timeout`).
    pub fn call(
        &self,
        name: &'static str,
        job: endpoint::Job<C>,
        timeout: std::time::Duration,
    ) -> ApiResponse {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        let gone = || ApiResponse::error(503, &["the VMM is shutting down"]);
        if self.messages.send(ApiMessage { name, job, reply }).is_err() {
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
pub fn channel<C>() -> std::io::Result<(ApiReceiver<C>, ApiSender<C>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let wake = EventFd::new(libc::EFD_NONBLOCK)?;
    let sender = ApiSender {
        messages: tx,
        wake: std::sync::Arc::new(wake.try_clone()?),
    };
    Ok((ApiReceiver { messages: rx, wake }, sender))
}
