//! MSI-X for the virtio-pci transport: the vector table and pending-bit
//! array (both in BAR 0), the capability's enable and function-mask bits,
//! and [`MsixInterrupt`], the [`VirtioInterrupt`] a device signals through.
//!
//! Data enters as guest accesses to the table/PBA and to the capability's
//! message control word, and as `trigger` calls from device workers. It
//! leaves as MSI routes handed to an [`MsiRouter`] (the VMM programs KVM)
//! and as writes to one irqfd per vector. A masked vector does not fire:
//! its pending bit is set instead, and it fires when unmasked.
//!
//! The request path writes nothing the queues share: a worker's
//! interrupt reads the "deliverable" bit of its vector (kept under the
//! lock whenever the guest changes the enable, function-mask or vector
//! mask bits) and writes the irqfd; only a vector that is masked (or
//! MSI-X off) takes the lock, to set its pending bit. The ISR byte is
//! written only when its bit is not yet set (drivers using MSI-X never
//! read it, so it stays set).

use std::io;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use vmm_sys_util::eventfd::EventFd;

use crate::device::{InterruptKind, VirtioInterrupt};

/// "No vector" in the common config's vector registers.
pub const NO_VECTOR: u16 = 0xffff;
/// Bytes per table entry: address (8), data (4), vector control (4).
pub const ENTRY_SIZE: u64 = 16;
const VECTOR_CTRL_MASKED: u32 = 1;

/// An MSI message as programmed into a table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

/// Where the transport's interrupts go: the VMM routes vector `v`'s irqfd
/// to the message the guest programmed (KVM GSI routing).
pub trait MsiRouter: Send + Sync {
    /// `None` disables the route.
    fn set_route(&self, vector: u16, msg: Option<MsiMessage>) -> io::Result<()>;
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    addr_lo: u32,
    addr_hi: u32,
    data: u32,
    ctrl: u32,
}

impl Default for Entry {
    fn default() -> Self {
        // Every vector starts masked (PCI spec).
        Entry {
            addr_lo: 0,
            addr_hi: 0,
            data: 0,
            ctrl: VECTOR_CTRL_MASKED,
        }
    }
}

impl Entry {
    fn masked(&self) -> bool {
        self.ctrl & VECTOR_CTRL_MASKED != 0
    }
    fn message(&self) -> MsiMessage {
        MsiMessage {
            address: (u64::from(self.addr_hi) << 32) | u64::from(self.addr_lo),
            data: self.data,
        }
    }
}

struct State {
    entries: Vec<Entry>,
    pending: Vec<u64>,
    enabled: bool,
    function_masked: bool,
}

/// The MSI-X state of one function, shared by the transport (guest
/// accesses) and the device workers (interrupts).
pub struct Msix {
    state: Mutex<State>,
    irqfds: Vec<EventFd>,
    router: Arc<dyn MsiRouter>,
    /// Vector of the config interrupt and of each queue (`NO_VECTOR` if none).
    config_vector: AtomicU16,
    queue_vectors: Vec<AtomicU16>,
    /// The ISR status byte (bit 0 queue, bit 1 config); read-to-clear.
    isr: std::sync::atomic::AtomicU8,
    /// Config changes the device signalled; added to the common config's
    /// `config_generation` so a driver sees the change.
    config_changes: std::sync::atomic::AtomicU8,
    /// Per 64 vectors, the ones that fire at once (MSI-X enabled, function
    /// not masked, vector not masked): written under `state`'s lock,
    /// read without it by [`Msix::signal`].
    deliverable: Vec<AtomicU64>,
}

impl Msix {
    /// `irqfds[v]` is vector `v`'s irqfd; the table has one entry per irqfd.
    pub fn new(irqfds: Vec<EventFd>, router: Arc<dyn MsiRouter>, num_queues: usize) -> Self {
        let n = irqfds.len();
        Msix {
            state: Mutex::new(State {
                entries: vec![Entry::default(); n],
                pending: vec![0; n.div_ceil(64)],
                enabled: false,
                function_masked: false,
            }),
            irqfds,
            router,
            config_vector: AtomicU16::new(NO_VECTOR),
            queue_vectors: (0..num_queues).map(|_| AtomicU16::new(NO_VECTOR)).collect(),
            isr: std::sync::atomic::AtomicU8::new(0),
            config_changes: std::sync::atomic::AtomicU8::new(0),
            deliverable: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Recomputes the deliverable bits from `s` (called with the lock held,
    /// after every change of the bits they depend on).
    fn publish_deliverable(&self, s: &State) {
        for (w, word) in self.deliverable.iter().enumerate() {
            let mut bits = 0u64;
            if s.enabled && !s.function_masked {
                for (i, e) in s.entries.iter().enumerate().skip(w * 64).take(64) {
                    if !e.masked() {
                        bits |= 1 << (i % 64);
                    }
                }
            }
            word.store(bits, Ordering::Release);
        }
    }

    /// Sets `bit` of the ISR byte unless it is set already (a read, not a
    /// write, on the request path once it is).
    fn raise_isr(&self, bit: u8) {
        if self.isr.load(Ordering::Acquire) & bit == 0 {
            self.isr.fetch_or(bit, Ordering::AcqRel);
        }
    }

    /// How many config changes the device has signalled (wrapping).
    pub fn config_changes(&self) -> u8 {
        self.config_changes.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn table_size(&self) -> u16 {
        u16::try_from(self.irqfds.len()).unwrap_or(u16::MAX)
    }

    /// Validates a vector the guest assigns: out of range reads back
    /// as `NO_VECTOR` (virtio spec).
    fn checked(&self, v: u16) -> u16 {
        if usize::from(v) < self.irqfds.len() {
            v
        } else {
            NO_VECTOR
        }
    }

    pub fn set_config_vector(&self, v: u16) {
        self.config_vector.store(self.checked(v), Ordering::Release);
    }
    pub fn config_vector(&self) -> u16 {
        self.config_vector.load(Ordering::Acquire)
    }
    pub fn set_queue_vector(&self, q: usize, v: u16) {
        if let Some(slot) = self.queue_vectors.get(q) {
            slot.store(self.checked(v), Ordering::Release);
        }
    }
    pub fn queue_vector(&self, q: usize) -> u16 {
        self.queue_vectors
            .get(q)
            .map_or(NO_VECTOR, |v| v.load(Ordering::Acquire))
    }

    /// Reads and clears the ISR byte.
    pub fn take_isr(&self) -> u8 {
        self.isr.swap(0, Ordering::AcqRel)
    }

    /// Forgets vector assignments (device reset). Table, mask and enable
    /// bits belong to PCI and survive a virtio reset.
    pub fn reset_vectors(&self) {
        self.config_vector.store(NO_VECTOR, Ordering::Release);
        for v in &self.queue_vectors {
            v.store(NO_VECTOR, Ordering::Release);
        }
        self.isr.store(0, Ordering::Release);
    }

    /// Message control bits 15 (enable) and 14 (function mask).
    pub fn message_control(&self) -> u16 {
        let s = self.lock();
        let mut mc = self.table_size().saturating_sub(1) & 0x7ff;
        if s.enabled {
            mc |= 1 << 15;
        }
        if s.function_masked {
            mc |= 1 << 14;
        }
        mc
    }

    pub fn set_message_control(&self, mc: u16) {
        let mut s = self.lock();
        s.enabled = mc & (1 << 15) != 0;
        s.function_masked = mc & (1 << 14) != 0;
        self.publish_deliverable(&s);
        self.fire_unmasked_pending(&mut s);
    }

    /// A 4- or 8-byte read in the table.
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        let s = self.lock();
        let mut out = [0u8; 8];
        for (i, chunk) in out.chunks_mut(4).enumerate() {
            let off = offset.saturating_add(4 * i as u64);
            let idx = usize::try_from(off / ENTRY_SIZE).unwrap_or(usize::MAX);
            let v = s.entries.get(idx).map_or(0, |e| match off % ENTRY_SIZE {
                0 => e.addr_lo,
                4 => e.addr_hi,
                8 => e.data,
                _ => e.ctrl,
            });
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        let n = data.len().min(8);
        data[..n].copy_from_slice(&out[..n]);
    }

    /// A 4- or 8-byte write in the table (other sizes are ignored, as the
    /// PCI spec allows).
    pub fn table_write(&self, offset: u64, data: &[u8]) {
        if !offset.is_multiple_of(4) || (data.len() != 4 && data.len() != 8) {
            return;
        }
        let mut s = self.lock();
        let mut touched = None;
        for (i, chunk) in data.chunks(4).enumerate() {
            let off = offset.saturating_add(4 * i as u64);
            let idx = usize::try_from(off / ENTRY_SIZE).unwrap_or(usize::MAX);
            let mut b = [0u8; 4];
            b.copy_from_slice(chunk);
            let v = u32::from_le_bytes(b);
            let Some(e) = s.entries.get_mut(idx) else {
                return;
            };
            match off % ENTRY_SIZE {
                0 => e.addr_lo = v,
                4 => e.addr_hi = v,
                8 => e.data = v,
                _ => e.ctrl = v & VECTOR_CTRL_MASKED,
            }
            touched = Some(idx);
        }
        if let Some(idx) = touched {
            let msg = s.entries[idx].message();
            let vector = u16::try_from(idx).unwrap_or(NO_VECTOR);
            if let Err(e) = self.router.set_route(vector, Some(msg)) {
                log::error!("cannot route MSI-X vector {vector}: {e}");
            }
            self.publish_deliverable(&s);
            self.fire_unmasked_pending(&mut s);
        }
    }

    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        let s = self.lock();
        let mut bytes = [0u8; 8];
        let idx = usize::try_from(offset / 8).unwrap_or(usize::MAX);
        if let Some(w) = s.pending.get(idx) {
            bytes = w.to_le_bytes();
        }
        let start = usize::try_from(offset % 8).unwrap_or(0);
        let n = data.len().min(8 - start);
        data[..n].copy_from_slice(&bytes[start..start + n]);
    }

    fn fire_unmasked_pending(&self, s: &mut State) {
        if !s.enabled || s.function_masked {
            return;
        }
        for v in 0..s.entries.len() {
            let (w, bit) = (v / 64, 1u64 << (v % 64));
            if s.pending[w] & bit != 0 && !s.entries[v].masked() {
                s.pending[w] &= !bit;
                if let Err(e) = self.irqfds[v].write(1) {
                    log::error!("cannot signal MSI-X vector {v}: {e}");
                }
            }
        }
    }

    /// Fires `vector`, or marks it pending if masked.
    pub fn signal(&self, vector: u16) -> io::Result<()> {
        let v = usize::from(vector);
        if v >= self.irqfds.len() {
            return Ok(());
        }
        let deliverable = self
            .deliverable
            .get(v / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (v % 64)) != 0);
        if deliverable {
            // A mask the guest sets right now may let this one through,
            // as an interrupt already in flight would on hardware.
            return self.irqfds[v].write(1);
        }
        let mut s = self.lock();
        if !s.enabled {
            // No INTx on this transport: a driver without MSI-X gets no
            // interrupts and must poll.
            return Ok(());
        }
        if s.function_masked || s.entries[v].masked() {
            s.pending[v / 64] |= 1 << (v % 64);
            return Ok(());
        }
        drop(s);
        self.irqfds[v].write(1)
    }
}

/// The handle a device gets in `activate`.
pub struct MsixInterrupt(pub Arc<Msix>);

impl VirtioInterrupt for MsixInterrupt {
    fn trigger(&self, kind: InterruptKind) -> io::Result<()> {
        let (vector, isr_bit) = match kind {
            InterruptKind::Config => {
                self.0.config_changes.fetch_add(1, Ordering::AcqRel);
                (self.0.config_vector(), 2)
            }
            InterruptKind::Queue(q) => (self.0.queue_vector(usize::from(q)), 1),
        };
        self.0.raise_isr(isr_bit);
        if vector == NO_VECTOR {
            return Ok(());
        }
        self.0.signal(vector)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Routes(Mutex<Vec<(u16, Option<MsiMessage>)>>);
    impl MsiRouter for Routes {
        fn set_route(&self, vector: u16, msg: Option<MsiMessage>) -> io::Result<()> {
            self.0.lock().unwrap().push((vector, msg));
            Ok(())
        }
    }

    fn msix(n: usize) -> (Arc<Msix>, Arc<Routes>) {
        let routes = Arc::new(Routes::default());
        let fds = (0..n)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
            .collect();
        (Arc::new(Msix::new(fds, routes.clone(), n - 1)), routes)
    }

    fn fired(m: &Msix, v: usize) -> bool {
        m.irqfds[v].read().is_ok()
    }

    #[test]
    fn programming_an_entry_routes_it() {
        let (m, routes) = msix(2);
        m.table_write(16, &0xfee0_1000u64.to_le_bytes());
        m.table_write(24, &0x4041u32.to_le_bytes());
        let last = *routes.0.lock().unwrap().last().unwrap();
        assert_eq!(
            last,
            (
                1,
                Some(MsiMessage {
                    address: 0xfee0_1000,
                    data: 0x4041
                })
            )
        );
        let mut d = [0u8; 4];
        m.table_read(24, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x4041);
        m.table_read(28, &mut d);
        assert_eq!(u32::from_le_bytes(d), 1, "entries start masked");
    }

    #[test]
    fn masked_vector_sets_pending_and_fires_on_unmask() {
        let (m, _) = msix(3);
        m.set_message_control(1 << 15);
        m.set_queue_vector(0, 1);
        let irq = MsixInterrupt(m.clone());
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        assert!(!fired(&m, 1));
        let mut pba = [0u8; 8];
        m.pba_read(0, &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 0b10);
        m.table_write(16 + 12, &0u32.to_le_bytes());
        assert!(fired(&m, 1));
        m.pba_read(0, &mut pba);
        assert_eq!(u64::from_le_bytes(pba), 0);
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        assert!(fired(&m, 1));
    }

    #[test]
    fn masking_again_stops_the_lock_free_path() {
        let (m, _) = msix(2);
        m.set_message_control(1 << 15);
        m.set_queue_vector(0, 0);
        let irq = MsixInterrupt(m.clone());
        m.table_write(12, &0u32.to_le_bytes());
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        assert!(fired(&m, 0), "unmasked: fires");
        m.table_write(12, &1u32.to_le_bytes());
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        assert!(!fired(&m, 0), "masked again: pending only");
        m.set_message_control(0);
        m.table_write(12, &0u32.to_le_bytes());
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        assert!(!fired(&m, 0), "MSI-X off: nothing");
        m.set_message_control(1 << 15);
        assert!(
            fired(&m, 0),
            "the one raised while masked fires once enabled"
        );
        assert_eq!(m.take_isr(), 1);
        irq.trigger(InterruptKind::Queue(0)).unwrap();
        assert_eq!(m.take_isr(), 1, "the ISR bit is raised again after a read");
    }

    #[test]
    fn function_mask_holds_everything() {
        let (m, _) = msix(2);
        m.table_write(12, &0u32.to_le_bytes());
        m.set_message_control((1 << 15) | (1 << 14));
        m.set_config_vector(0);
        MsixInterrupt(m.clone())
            .trigger(InterruptKind::Config)
            .unwrap();
        assert!(!fired(&m, 0));
        m.set_message_control(1 << 15);
        assert!(fired(&m, 0));
        assert_eq!(m.take_isr(), 2);
        assert_eq!(m.take_isr(), 0);
    }

    #[test]
    fn out_of_range_vector_reads_back_no_vector() {
        let (m, _) = msix(2);
        m.set_queue_vector(0, 5);
        assert_eq!(m.queue_vector(0), NO_VECTOR);
        m.set_queue_vector(0, 1);
        assert_eq!(m.queue_vector(0), 1);
        // Entries beyond the table are ignored, not a panic.
        m.table_write(4096, &[0; 4]);
        let mut d = [0u8; 4];
        m.table_read(4096, &mut d);
        assert_eq!(d, [0; 4]);
    }
}
