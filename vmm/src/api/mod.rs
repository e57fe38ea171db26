//! The HTTP API (`--api-socket`): Cloud Hypervisor's REST API on a Unix
//! socket, for the endpoints this VMM implements (docs/api.md).
//!
//! Flow: the server thread ([`server`]) accepts a connection and gives it
//! a thread of its own (a few at most); that thread reads one HTTP/1.1
//! request with deadlines and size limits ([`http`]), finds its row in
//! the endpoint table ([`routes`], rows as [`endpoint`] defines them,
//! bodies in [`types`] and [`bitmap_types`]), which checks the body and
//! makes a job, and sends the job to the VMM's control loop as an
//! [`ApiMessage`] ([`channel`](mod@channel)), waking the loop through an
//! eventfd. It
//! then waits for the [`ApiResponse`], writes it and closes the
//! connection. The API threads never touch a device, an image or the
//! vCPUs, and hold no lock the request path takes: everything happens in
//! the control loop (`crate::control`), one request at a time.

pub mod backup_types;
pub mod bitmap_types;
pub mod channel;
pub mod client;
pub mod endpoint;
pub mod http;
pub mod job_flags;
pub mod job_wait;
pub mod response;
pub mod routes;
mod server;
pub mod socket;
pub mod types;

pub use channel::{channel, ApiMessage, ApiReceiver, ApiSender};
pub use response::ApiResponse;
pub use server::ApiServer;
