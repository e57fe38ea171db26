//! Why a virtio-pci function could not be built or activated: the error
//! the BAR layout ([`super::layout`]) and the device
//! ([`super::virtio_pci`]) share.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TransportError {
    #[error("device has {queues} queues; MSI-X needs {needed} vectors, table holds {max}")]
    TooManyQueues {
        queues: usize,
        needed: usize,
        max: usize,
    },
    #[error("{got} irqfds for {needed} MSI-X vectors")]
    IrqfdCount { got: usize, needed: usize },
    #[error("cannot create kick eventfd")]
    CreateEventFd(#[source] std::io::Error),
    #[error("PCI config space has no room for the capabilities")]
    ConfigSpaceFull,
}
