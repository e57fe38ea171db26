//! Where a guest write should signal an eventfd: the address type that
//! [`crate::vm::Vm::register_ioevent`] takes and its errors name, apart
//! from both so the error type does not depend on the VM.

/// A port or an MMIO address a guest writes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEventAddress {
    Pio(u64),
    Mmio(u64),
}

impl From<IoEventAddress> for kvm_ioctls::IoEventAddress {
    fn from(a: IoEventAddress) -> Self {
        match a {
            IoEventAddress::Pio(p) => kvm_ioctls::IoEventAddress::Pio(p),
            IoEventAddress::Mmio(m) => kvm_ioctls::IoEventAddress::Mmio(m),
        }
    }
}
