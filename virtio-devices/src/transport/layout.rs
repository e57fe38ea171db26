//! BAR 0's layout and the PCI configuration space of a virtio-pci
//! function: IDs, the MSI-X capability and the virtio vendor capabilities
//! (common, ISR, device, notify, PCI-config access) that point into BAR 0.
//!
//! Enters as the device type, queue count and BAR address; leaves as a
//! [`PciConfig`] plus the offsets of the capabilities the transport
//! intercepts.

use super::common_config::COMMON_CONFIG_SIZE;
use super::error::TransportError;
use super::msix::ENTRY_SIZE;
use super::pci_config::PciConfig;

/// PCI vendor ID of virtio devices.
pub const VIRTIO_PCI_VENDOR: u16 = 0x1af4;

// BAR 0 layout.
pub const COMMON_OFFSET: u64 = 0x0000;
pub const ISR_OFFSET: u64 = 0x1000;
pub const DEVICE_CFG_OFFSET: u64 = 0x2000;
pub const DEVICE_CFG_SIZE: u64 = 0x1000;
pub const NOTIFY_OFFSET: u64 = 0x3000;
pub const NOTIFY_MULTIPLIER: u32 = 4;
pub const MSIX_TABLE_OFFSET: u64 = 0x4000;
pub const MSIX_PBA_OFFSET: u64 = 0x6000;
pub const BAR_SIZE: u32 = 0x8000;
/// The table region holds this many entries.
pub const MAX_VECTORS: usize = ((MSIX_PBA_OFFSET - MSIX_TABLE_OFFSET) / ENTRY_SIZE) as usize;

// Virtio PCI capability types.
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;
const CAP_PCI_CFG: u8 = 5;
const CAP_ID_VENDOR: u8 = 0x09;
const CAP_ID_MSIX: u8 = 0x11;

fn vendor_cap(cfg_type: u8, offset: u64, length: u64, extra: &[u8]) -> Vec<u8> {
    let len = 16 + extra.len();
    let mut c = vec![CAP_ID_VENDOR, 0, len as u8, cfg_type, 0, 0, 0, 0];
    // BAR offsets and lengths are below BAR_SIZE (32 KiB).
    c.extend_from_slice(&(offset as u32).to_le_bytes());
    c.extend_from_slice(&(length as u32).to_le_bytes());
    c.extend_from_slice(extra);
    c
}

/// A function's config space and where its intercepted capabilities are.
pub struct FunctionConfig {
    pub config: PciConfig,
    /// Offset of the MSI-X capability.
    pub msix_cap: usize,
    /// Offset of the PCI-config-access capability.
    pub pci_cfg_cap: usize,
}

/// Builds the config space of a virtio function of `device_type` with
/// `queues` queues (one MSI-X vector each, plus config) and BAR 0 at
/// `bar_addr`.
pub fn build_config(
    device_type: u32,
    queues: usize,
    bar_addr: u32,
) -> Result<FunctionConfig, TransportError> {
    let needed = queues + 1;
    let pci_device_id = 0x1040u16.saturating_add(u16::try_from(device_type).unwrap_or(0));
    // Class: mass storage (other) for block, "other" otherwise.
    let class = if device_type == 2 {
        [0x01, 0x80, 0]
    } else {
        [0xff, 0, 0]
    };
    let mut config = PciConfig::new(
        VIRTIO_PCI_VENDOR,
        pci_device_id,
        1,
        class,
        (VIRTIO_PCI_VENDOR, 0x40),
        bar_addr,
        BAR_SIZE,
    );
    let full = || TransportError::ConfigSpaceFull;
    let mut msix_body = vec![CAP_ID_MSIX, 0];
    let table_size = u16::try_from(needed - 1).map_err(|_| full())?;
    msix_body.extend_from_slice(&table_size.to_le_bytes());
    // Table and PBA in BAR 0 (BIR 0 in the low 3 bits).
    msix_body.extend_from_slice(&(MSIX_TABLE_OFFSET as u32).to_le_bytes());
    msix_body.extend_from_slice(&(MSIX_PBA_OFFSET as u32).to_le_bytes());
    // Only enable (bit 15) and function mask (bit 14) are writable:
    // byte 3 of the capability, bits 6 and 7.
    let msix_cap = config.add_capability(&msix_body, &[]).ok_or_else(full)?;
    config.set_write_mask(msix_cap + 3, 0xc0);
    config
        .add_capability(
            &vendor_cap(CAP_COMMON, COMMON_OFFSET, COMMON_CONFIG_SIZE, &[]),
            &[],
        )
        .ok_or_else(full)?;
    config
        .add_capability(&vendor_cap(CAP_ISR, ISR_OFFSET, 1, &[]), &[])
        .ok_or_else(full)?;
    config
        .add_capability(
            &vendor_cap(CAP_DEVICE, DEVICE_CFG_OFFSET, DEVICE_CFG_SIZE, &[]),
            &[],
        )
        .ok_or_else(full)?;
    let notify_len = u64::from(NOTIFY_MULTIPLIER) * queues as u64;
    config
        .add_capability(
            &vendor_cap(
                CAP_NOTIFY,
                NOTIFY_OFFSET,
                notify_len.max(4),
                &NOTIFY_MULTIPLIER.to_le_bytes(),
            ),
            &[],
        )
        .ok_or_else(full)?;
    // The PCI configuration access capability: bar (byte 4), offset,
    // length and the data window are driver-writable.
    let pci_cfg_cap = config
        .add_capability(&vendor_cap(CAP_PCI_CFG, 0, 0, &[0; 4]), &[(4, 1), (8, 12)])
        .ok_or_else(full)?;

    Ok(FunctionConfig {
        config,
        msix_cap,
        pci_cfg_cap,
    })
}
