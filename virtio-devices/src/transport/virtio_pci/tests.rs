//! Drives a [`VirtioPciDevice`] the way a guest driver does (capability
//! walk, feature negotiation, queue set-up, DRIVER_OK, MSI-X programming,
//! notify, reset) around a dummy device that records what it is given.

use std::io;
use std::sync::{Arc, Mutex};

use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::device::{ActivateError, ActivatedQueue, InterruptKind, VirtioInterrupt};
use crate::transport::msix::MsiMessage;

#[derive(Default)]
struct Record {
    acked: u64,
    activated: Vec<(u16, u16, u64)>,
    interrupt: Option<Arc<dyn VirtioInterrupt>>,
    kicks: Vec<EventFd>,
    resets: usize,
    shutdowns: usize,
}

struct Dummy(Arc<Mutex<Record>>);

impl VirtioDevice for Dummy {
    fn device_type(&self) -> u32 {
        2
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &[64, 64]
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1 | (1 << 9) | (1 << 34)
    }
    fn ack_features(&mut self, f: u64) {
        self.0.lock().unwrap().acked = f;
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = (offset as u8).wrapping_add(i as u8);
        }
    }
    fn write_config(&mut self, _: u64, _: &[u8]) {}
    fn activate(
        &mut self,
        _mem: Arc<GuestMemoryMmap>,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: Vec<ActivatedQueue>,
    ) -> Result<(), ActivateError> {
        let mut r = self.0.lock().unwrap();
        for q in queues {
            r.activated
                .push((q.index, q.queue.size(), q.queue.desc_table()));
            r.kicks.push(q.kick);
        }
        r.interrupt = Some(interrupt);
        Ok(())
    }
    fn reset(&mut self) -> Vec<EventFd> {
        let mut r = self.0.lock().unwrap();
        r.resets += 1;
        r.interrupt = None;
        std::mem::take(&mut r.kicks)
    }
    fn shutdown(&mut self) {
        self.0.lock().unwrap().shutdowns += 1;
    }
}

#[derive(Default)]
struct Routes(Mutex<Vec<(u16, Option<MsiMessage>)>>);
impl MsiRouter for Routes {
    fn set_route(&self, v: u16, m: Option<MsiMessage>) -> io::Result<()> {
        self.0.lock().unwrap().push((v, m));
        Ok(())
    }
}

struct Rig {
    dev: VirtioPciDevice,
    rec: Arc<Mutex<Record>>,
    irqfds: Vec<EventFd>,
    routes: Arc<Routes>,
}

fn rig() -> Rig {
    let rec = Arc::new(Mutex::new(Record::default()));
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let irqfds: Vec<EventFd> = (0..3)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let clones = irqfds.iter().map(|f| f.try_clone().unwrap()).collect();
    let routes = Arc::new(Routes::default());
    let dev = VirtioPciDevice::new(
        Box::new(Dummy(rec.clone())),
        mem,
        0xe000_0000,
        clones,
        routes.clone(),
    )
    .unwrap();
    Rig {
        dev,
        rec,
        irqfds,
        routes,
    }
}

fn cfg32(d: &mut VirtioPciDevice, off: usize) -> u32 {
    let mut b = [0u8; 4];
    d.config_read(off, &mut b);
    u32::from_le_bytes(b)
}

fn bar_w(d: &mut VirtioPciDevice, off: u64, v: &[u8]) {
    d.bar_write(off, v);
}

fn bar_r32(d: &mut VirtioPciDevice, off: u64) -> u32 {
    let mut b = [0u8; 4];
    d.bar_read(off, &mut b);
    u32::from_le_bytes(b)
}

/// Walks the capability list: (id, cfg_type or 0, offset in config).
fn caps(d: &mut VirtioPciDevice) -> Vec<(u8, u8, usize)> {
    let mut out = Vec::new();
    let mut p = (cfg32(d, 0x34) & 0xff) as usize;
    while p != 0 && out.len() < 16 {
        let head = cfg32(d, p);
        let id = head as u8;
        let ty = if id == 0x09 { (head >> 24) as u8 } else { 0 };
        out.push((id, ty, p));
        p = ((head >> 8) & 0xff) as usize;
    }
    out
}

#[test]
fn identity_and_capabilities() {
    let mut r = rig();
    let d = &mut r.dev;
    assert_eq!(cfg32(d, 0), 0x1042_1af4);
    assert_ne!(cfg32(d, 4) >> 16 & 0x10, 0, "capability list bit");
    let c = caps(d);
    let types: Vec<u8> = c.iter().map(|x| x.1).collect();
    assert_eq!(c[0].0, 0x11, "MSI-X first");
    for t in [1, 2, 3, 4, 5] {
        assert!(types.contains(&t), "virtio cap type {t} missing: {types:?}");
    }
    // MSI-X: 3 entries, table and PBA in BAR 0.
    let msix = c[0].2;
    assert_eq!(cfg32(d, msix) >> 16 & 0x7ff, 2);
    assert_eq!(cfg32(d, msix + 4), MSIX_TABLE_OFFSET as u32);
    assert_eq!(cfg32(d, msix + 8), MSIX_PBA_OFFSET as u32);
    // Notify cap carries the multiplier.
    let notify = c.iter().find(|x| x.1 == 2).unwrap().2;
    assert_eq!(cfg32(d, notify + 16), NOTIFY_MULTIPLIER);
    // BAR sizing.
    d.config_write(0x10, &[0xff; 4]);
    assert_eq!(cfg32(d, 0x10), !(BAR_SIZE - 1));
    d.config_write(0x10, &0xe000_0000u32.to_le_bytes());
    assert_eq!(d.bar_range(), (0xe000_0000, u64::from(BAR_SIZE)));
}

#[test]
fn driver_bring_up_interrupts_notify_and_reset() {
    let mut r = rig();
    let d = &mut r.dev;
    // Enable MSI-X and program vector 1 (queue 0) unmasked.
    let msix = caps(d)[0].2;
    d.config_write(msix + 2, &(1u16 << 15).to_le_bytes());
    bar_w(d, MSIX_TABLE_OFFSET + 16, &0xfee0_0000u32.to_le_bytes());
    bar_w(d, MSIX_TABLE_OFFSET + 24, &0x31u32.to_le_bytes());
    bar_w(d, MSIX_TABLE_OFFSET + 28, &0u32.to_le_bytes());
    assert!(r.routes.0.lock().unwrap().contains(&(
        1,
        Some(MsiMessage {
            address: 0xfee0_0000,
            data: 0x31
        })
    )));

    bar_w(d, 0x14, &[1 | 2]);
    // Packed ring (bit 34) is filtered out by the transport.
    bar_w(d, 0x00, &1u32.to_le_bytes());
    assert_eq!(bar_r32(d, 0x04), 1, "only VERSION_1 in the high word");
    // Ask for a feature not offered: FEATURES_OK must not stick.
    bar_w(d, 0x08, &1u32.to_le_bytes());
    bar_w(d, 0x0c, &(1u32 | 4).to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8]);
    let mut st = [0u8];
    d.bar_read(0x14, &mut st);
    assert_eq!(st[0] & 8, 0);
    bar_w(d, 0x0c, &1u32.to_le_bytes());
    bar_w(d, 0x08, &0u32.to_le_bytes());
    bar_w(d, 0x0c, &(1u32 << 9).to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8]);
    d.bar_read(0x14, &mut st);
    assert_eq!(st[0] & 8, 8);
    assert_eq!(r.rec.lock().unwrap().acked, VIRTIO_F_VERSION_1 | (1 << 9));

    // Queue 0: 32 entries at 0x1000/0x2000/0x3000, vector 1.
    bar_w(d, 0x16, &0u16.to_le_bytes());
    bar_w(d, 0x18, &32u16.to_le_bytes());
    bar_w(d, 0x1a, &1u16.to_le_bytes());
    bar_w(d, 0x20, &0x1000u64.to_le_bytes());
    bar_w(d, 0x28, &0x2000u64.to_le_bytes());
    bar_w(d, 0x30, &0x3000u64.to_le_bytes());
    bar_w(d, 0x1c, &1u16.to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8 | 4]);
    {
        let rec = r.rec.lock().unwrap();
        assert_eq!(rec.activated, vec![(0, 32, 0x1000)], "only queue 0 enabled");
        // Device interrupt for queue 0 reaches irqfd 1.
        rec.interrupt
            .as_ref()
            .unwrap()
            .trigger(InterruptKind::Queue(0))
            .unwrap();
    }
    assert_eq!(r.irqfds[1].read().unwrap(), 1);
    // A notify write that reaches us kicks the device's eventfd.
    bar_w(d, NOTIFY_OFFSET, &0u16.to_le_bytes());
    assert_eq!(r.rec.lock().unwrap().kicks[0].read().unwrap(), 1);
    // Device config goes to the device.
    assert_eq!(bar_r32(d, DEVICE_CFG_OFFSET + 4), 0x0706_0504);

    // Reset: device reset, kicks returned, registers cleared.
    bar_w(d, 0x14, &[0]);
    d.bar_read(0x14, &mut st);
    assert_eq!(st[0], 0);
    assert_eq!(r.rec.lock().unwrap().resets, 1);
    let mut v = [0u8; 2];
    d.bar_read(0x1a, &mut v);
    assert_eq!(u16::from_le_bytes(v), 0xffff, "vectors forgotten");
    // Re-activation works and hands out eventfds again; the kick path
    // still reaches the new eventfd.
    bar_w(d, 0x08, &1u32.to_le_bytes());
    bar_w(d, 0x0c, &1u32.to_le_bytes());
    bar_w(d, 0x1c, &1u16.to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8 | 4]);
    bar_w(d, NOTIFY_OFFSET, &0u16.to_le_bytes());
    let rec = r.rec.lock().unwrap();
    assert_eq!(rec.activated.len(), 2);
    assert_eq!(rec.kicks[0].read().unwrap(), 1);
    drop(rec);
    d.shutdown();
    assert_eq!(r.rec.lock().unwrap().shutdowns, 1);
}

/// Features negotiated and queue 0 set up at 0x1000; DRIVER_OK next.
fn negotiate_and_set_up_queue0(d: &mut VirtioPciDevice) {
    bar_w(d, 0x14, &[1 | 2]);
    bar_w(d, 0x08, &1u32.to_le_bytes());
    bar_w(d, 0x0c, &1u32.to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8]);
    bar_w(d, 0x16, &0u16.to_le_bytes());
    bar_w(d, 0x18, &32u16.to_le_bytes());
    bar_w(d, 0x20, &0x1000u64.to_le_bytes());
    bar_w(d, 0x28, &0x2000u64.to_le_bytes());
    bar_w(d, 0x30, &0x3000u64.to_le_bytes());
    bar_w(d, 0x1c, &1u16.to_le_bytes());
}

#[test]
fn the_observer_hears_activation_and_driver_resets_only() {
    let mut r = rig();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    r.dev
        .set_event_observer(Arc::new(move |e| log.lock().unwrap().push(e)));
    // A reset before activation is not an event (the driver's first
    // step at every boot).
    bar_w(&mut r.dev, 0x14, &[0]);
    negotiate_and_set_up_queue0(&mut r.dev);
    bar_w(&mut r.dev, 0x14, &[1 | 2 | 8 | 4]);
    bar_w(&mut r.dev, 0x14, &[0]);
    assert_eq!(
        *seen.lock().unwrap(),
        [DeviceEvent::Activated, DeviceEvent::Reset]
    );
}

#[test]
fn into_device_resets_an_active_device_and_hands_it_over() {
    let mut r = rig();
    negotiate_and_set_up_queue0(&mut r.dev);
    bar_w(&mut r.dev, 0x14, &[1 | 2 | 8 | 4]);
    assert_eq!(r.rec.lock().unwrap().activated.len(), 1);
    let device = r.dev.into_device();
    let rec = r.rec.lock().unwrap();
    assert_eq!((rec.resets, rec.shutdowns), (1, 0), "reset, not shut down");
    assert!(rec.kicks.is_empty(), "the kicks came back");
    drop(rec);
    // The same device goes behind a new function and works there.
    let mem = Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
    let irqfds = (0..3)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let mut again = VirtioPciDevice::new(
        device,
        mem,
        0xe000_8000,
        irqfds,
        Arc::new(Routes::default()),
    )
    .unwrap();
    negotiate_and_set_up_queue0(&mut again);
    bar_w(&mut again, 0x14, &[1 | 2 | 8 | 4]);
    assert_eq!(r.rec.lock().unwrap().activated.len(), 2);
}

#[test]
fn bad_queue_address_fails_activation_with_needs_reset() {
    let mut r = rig();
    let d = &mut r.dev;
    bar_w(d, 0x08, &1u32.to_le_bytes());
    bar_w(d, 0x0c, &1u32.to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8]);
    bar_w(d, 0x20, &0xffff_0000u64.to_le_bytes()); // outside guest RAM
    bar_w(d, 0x1c, &1u16.to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8 | 4]);
    let mut st = [0u8];
    d.bar_read(0x14, &mut st);
    assert_ne!(st[0] & STATUS_NEEDS_RESET, 0);
    assert!(r.rec.lock().unwrap().activated.is_empty());
}

#[test]
fn pci_cfg_access_window_reaches_the_bar() {
    let mut r = rig();
    let d = &mut r.dev;
    let cap = caps(d).iter().find(|x| x.1 == 5).unwrap().2;
    d.config_write(cap + 4, &[0]); // BAR 0
    d.config_write(cap + 8, &((DEVICE_CFG_OFFSET + 8) as u32).to_le_bytes());
    d.config_write(cap + 12, &4u32.to_le_bytes());
    assert_eq!(cfg32(d, cap + 16), 0x0b0a_0908);
}

mod hostile;
