//! The virtio-pci common configuration structure (virtio 1.2, 4.1.4.3):
//! feature negotiation, device status and the per-queue registers.
//!
//! Guest accesses enter through [`CommonConfig::read`] and
//! [`CommonConfig::write`]; the register file lives here, the device's
//! feature bits are passed in, and writes with side effects (device status,
//! driver features) come back as a [`CommonWrite`] for the transport to act
//! on. MSI-X vector registers go straight to [`Msix`].

use super::msix::Msix;

// Register offsets.
const DEVICE_FEATURE_SELECT: u64 = 0x00;
const DEVICE_FEATURE: u64 = 0x04;
const DRIVER_FEATURE_SELECT: u64 = 0x08;
const DRIVER_FEATURE: u64 = 0x0c;
const CONFIG_MSIX_VECTOR: u64 = 0x10;
const NUM_QUEUES: u64 = 0x12;
const DEVICE_STATUS: u64 = 0x14;
const CONFIG_GENERATION: u64 = 0x15;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE: u64 = 0x18;
const QUEUE_MSIX_VECTOR: u64 = 0x1a;
const QUEUE_ENABLE: u64 = 0x1c;
const QUEUE_NOTIFY_OFF: u64 = 0x1e;
const QUEUE_DESC: u64 = 0x20;
const QUEUE_DRIVER: u64 = 0x28;
const QUEUE_DEVICE: u64 = 0x30;
/// Size of the structure we expose.
pub const COMMON_CONFIG_SIZE: u64 = 0x38;

/// One queue's driver-programmed state.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueRegs {
    pub max_size: u16,
    pub size: u16,
    pub enabled: bool,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
}

/// A write the transport must act on.
#[derive(Debug, PartialEq, Eq)]
pub enum CommonWrite {
    None,
    /// The driver wrote the device status register.
    Status(u8),
}

pub struct CommonConfig {
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    pub status: u8,
    pub config_generation: u8,
    pub queue_select: u16,
    pub queues: Vec<QueueRegs>,
}

impl CommonConfig {
    pub fn new(queue_max_sizes: &[u16]) -> Self {
        CommonConfig {
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            status: 0,
            config_generation: 0,
            queue_select: 0,
            queues: queue_max_sizes
                .iter()
                .map(|&m| QueueRegs {
                    max_size: m,
                    size: m,
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// Back to the state after power-on (device reset).
    pub fn reset(&mut self) {
        let sizes: Vec<u16> = self.queues.iter().map(|q| q.max_size).collect();
        let generation = self.config_generation;
        *self = CommonConfig::new(&sizes);
        self.config_generation = generation;
    }

    fn selected(&self) -> Option<&QueueRegs> {
        self.queues.get(usize::from(self.queue_select))
    }

    fn selected_mut(&mut self) -> Option<&mut QueueRegs> {
        self.queues.get_mut(usize::from(self.queue_select))
    }

    pub fn read(&self, offset: u64, data: &mut [u8], device_features: u64, msix: &Msix) {
        let q = self.selected();
        let qs = usize::from(self.queue_select);
        let v: u64 = match offset {
            DEVICE_FEATURE_SELECT => u64::from(self.device_feature_select),
            DEVICE_FEATURE => match self.device_feature_select {
                0 => device_features & 0xffff_ffff,
                1 => device_features >> 32,
                _ => 0,
            },
            DRIVER_FEATURE_SELECT => u64::from(self.driver_feature_select),
            DRIVER_FEATURE => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            CONFIG_MSIX_VECTOR => u64::from(msix.config_vector()),
            NUM_QUEUES => self.queues.len() as u64,
            DEVICE_STATUS => u64::from(self.status),
            CONFIG_GENERATION => {
                u64::from(self.config_generation.wrapping_add(msix.config_changes()))
            }
            QUEUE_SELECT => u64::from(self.queue_select),
            QUEUE_SIZE => q.map_or(0, |q| u64::from(q.size)),
            QUEUE_MSIX_VECTOR => {
                if q.is_some() {
                    u64::from(msix.queue_vector(qs))
                } else {
                    u64::from(super::msix::NO_VECTOR)
                }
            }
            QUEUE_ENABLE => q.map_or(0, |q| u64::from(q.enabled)),
            QUEUE_NOTIFY_OFF => q.map_or(0, |_| u64::from(self.queue_select)),
            o if (QUEUE_DESC..QUEUE_DESC + 8).contains(&o) => {
                q.map_or(0, |q| q.desc >> ((o - QUEUE_DESC) * 8))
            }
            o if (QUEUE_DRIVER..QUEUE_DRIVER + 8).contains(&o) => {
                q.map_or(0, |q| q.driver >> ((o - QUEUE_DRIVER) * 8))
            }
            o if (QUEUE_DEVICE..QUEUE_DEVICE + 8).contains(&o) => {
                q.map_or(0, |q| q.device >> ((o - QUEUE_DEVICE) * 8))
            }
            _ => 0,
        };
        let bytes = v.to_le_bytes();
        let n = data.len().min(8);
        data[..n].copy_from_slice(&bytes[..n]);
    }

    pub fn write(&mut self, offset: u64, data: &[u8], msix: &Msix) -> CommonWrite {
        let mut b = [0u8; 8];
        let n = data.len().min(8);
        b[..n].copy_from_slice(&data[..n]);
        let v = u64::from_le_bytes(b);
        // Truncations below are the register widths.
        let (v32, v16) = (v as u32, v as u16);
        // Queue registers are frozen once the queue is enabled, and
        // everything but status is frozen after DRIVER_OK.
        let driver_ok = self.status & super::status::STATUS_DRIVER_OK != 0;
        let sel = usize::from(self.queue_select);
        let set_addr = |field: &mut u64, base: u64| {
            let shift = (offset - base) * 8;
            let mask = if n >= 8 {
                u64::MAX
            } else {
                ((1u64 << (n * 8)) - 1) << shift
            };
            *field = (*field & !mask) | ((v << shift) & mask);
        };
        match offset {
            DEVICE_FEATURE_SELECT => self.device_feature_select = v32,
            DRIVER_FEATURE_SELECT => self.driver_feature_select = v32,
            DRIVER_FEATURE if !driver_ok => match self.driver_feature_select {
                0 => self.driver_features = (self.driver_features & !0xffff_ffff) | u64::from(v32),
                1 => {
                    self.driver_features =
                        (self.driver_features & 0xffff_ffff) | (u64::from(v32) << 32)
                }
                _ => {}
            },
            CONFIG_MSIX_VECTOR => msix.set_config_vector(v16),
            DEVICE_STATUS => return CommonWrite::Status(v as u8),
            QUEUE_SELECT => self.queue_select = v16,
            QUEUE_MSIX_VECTOR if sel < self.queues.len() => msix.set_queue_vector(sel, v16),
            _ if driver_ok => {}
            QUEUE_SIZE => {
                if let Some(q) = self.selected_mut().filter(|q| !q.enabled) {
                    // The driver may shrink a queue; the size stays a
                    // power of two no larger than the maximum.
                    if v16 != 0 && v16 <= q.max_size && v16.is_power_of_two() {
                        q.size = v16;
                    }
                }
            }
            QUEUE_ENABLE => {
                if let Some(q) = self.selected_mut() {
                    if v16 == 1 {
                        q.enabled = true;
                    }
                }
            }
            o if (QUEUE_DESC..QUEUE_DESC + 8).contains(&o) => {
                if let Some(q) = self.selected_mut().filter(|q| !q.enabled) {
                    set_addr(&mut q.desc, QUEUE_DESC);
                }
            }
            o if (QUEUE_DRIVER..QUEUE_DRIVER + 8).contains(&o) => {
                if let Some(q) = self.selected_mut().filter(|q| !q.enabled) {
                    set_addr(&mut q.driver, QUEUE_DRIVER);
                }
            }
            o if (QUEUE_DEVICE..QUEUE_DEVICE + 8).contains(&o) => {
                if let Some(q) = self.selected_mut().filter(|q| !q.enabled) {
                    set_addr(&mut q.device, QUEUE_DEVICE);
                }
            }
            _ => {}
        }
        CommonWrite::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct NoRoutes;
    impl super::super::msix::MsiRouter for NoRoutes {
        fn set_route(
            &self,
            _: u16,
            _: Option<super::super::msix::MsiMessage>,
        ) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn msix() -> Msix {
        let fds = (0..3)
            .map(|_| vmm_sys_util::eventfd::EventFd::new(0).unwrap())
            .collect();
        Msix::new(fds, Arc::new(NoRoutes), 2)
    }

    fn rd(c: &CommonConfig, m: &Msix, off: u64, len: usize) -> u64 {
        let mut b = [0u8; 8];
        c.read(off, &mut b[..len], 0x1_0000_0042, m);
        u64::from_le_bytes(b)
    }

    #[test]
    fn features_by_select() {
        let m = msix();
        let mut c = CommonConfig::new(&[128, 128]);
        assert_eq!(rd(&c, &m, DEVICE_FEATURE, 4), 0x42);
        c.write(DEVICE_FEATURE_SELECT, &1u32.to_le_bytes(), &m);
        assert_eq!(rd(&c, &m, DEVICE_FEATURE, 4), 1);
        c.write(DRIVER_FEATURE_SELECT, &1u32.to_le_bytes(), &m);
        c.write(DRIVER_FEATURE, &1u32.to_le_bytes(), &m);
        c.write(DRIVER_FEATURE_SELECT, &0u32.to_le_bytes(), &m);
        c.write(DRIVER_FEATURE, &2u32.to_le_bytes(), &m);
        assert_eq!(c.driver_features, 0x1_0000_0002);
        assert_eq!(c.write(DEVICE_STATUS, &[3], &m), CommonWrite::Status(3));
    }

    #[test]
    fn queue_registers() {
        let m = msix();
        let mut c = CommonConfig::new(&[256, 256]);
        assert_eq!(rd(&c, &m, NUM_QUEUES, 2), 2);
        c.write(QUEUE_SELECT, &1u16.to_le_bytes(), &m);
        assert_eq!(rd(&c, &m, QUEUE_SIZE, 2), 256);
        c.write(QUEUE_SIZE, &100u16.to_le_bytes(), &m);
        assert_eq!(rd(&c, &m, QUEUE_SIZE, 2), 256, "not a power of two");
        c.write(QUEUE_SIZE, &64u16.to_le_bytes(), &m);
        c.write(QUEUE_DESC, &0x1000u32.to_le_bytes(), &m);
        c.write(QUEUE_DESC + 4, &0x1u32.to_le_bytes(), &m);
        c.write(QUEUE_DRIVER, &0x2000u64.to_le_bytes(), &m);
        c.write(QUEUE_MSIX_VECTOR, &2u16.to_le_bytes(), &m);
        c.write(QUEUE_ENABLE, &1u16.to_le_bytes(), &m);
        c.write(QUEUE_DESC, &0x9000u32.to_le_bytes(), &m);
        let q = c.queues[1];
        assert_eq!(
            (q.size, q.desc, q.driver, q.enabled),
            (64, 0x1_0000_1000, 0x2000, true)
        );
        assert_eq!(rd(&c, &m, QUEUE_MSIX_VECTOR, 2), 2);
        assert_eq!(rd(&c, &m, QUEUE_NOTIFY_OFF, 2), 1);
        // A selector past the last queue reads size 0 and writes nothing.
        c.write(QUEUE_SELECT, &7u16.to_le_bytes(), &m);
        assert_eq!(rd(&c, &m, QUEUE_SIZE, 2), 0);
        c.write(QUEUE_ENABLE, &1u16.to_le_bytes(), &m);
        c.reset();
        assert!(!c.queues[1].enabled);
        assert_eq!(c.queues[1].size, 256);
    }
}
