//! What the KVM tests share: guest RAM, a VM or a skip, a vCPU run with
//! a deadline, and the tables of a 64-bit guest.

// Each test file uses a part of this module.
#![allow(dead_code)]

use std::time::Duration;

use hypervisor::Vm;

pub const MEM_SIZE: usize = 1 << 20;

/// Anonymous guest RAM that unmaps on drop.
pub struct Ram(pub *mut u8);

// SAFETY: the mapping is plain memory owned by this value; moving the
// owner to another thread moves nothing else.
unsafe impl Send for Ram {}

impl Ram {
    pub fn new() -> Ram {
        // SAFETY: anonymous private mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEM_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Ram(p.cast())
    }

    pub fn write(&mut self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= MEM_SIZE);
        // SAFETY: in bounds of our mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.0.add(at), bytes.len()) };
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`.
        unsafe { libc::munmap(self.0.cast(), MEM_SIZE) };
    }
}

pub fn vm_or_skip() -> Option<std::sync::Arc<Vm>> {
    match Vm::new() {
        Ok(vm) => Some(vm),
        Err(e) => {
            testkit::available("KVM", Err(e.to_string()));
            None
        }
    }
}

/// Runs `body` on its own thread and fails the test if it takes longer
/// than `limit` (a guest that spins without exiting would otherwise hang
/// the test; the stuck thread dies with the test process).
#[track_caller]
pub fn with_deadline<T: Send + 'static>(
    limit: Duration,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    testkit::with_deadline("the guest", limit, body)
}

/// Where [`write_long_mode_tables`] puts things (guest physical).
pub const GDT: usize = 0x500;
/// Selectors as Linux has them: kernel code and data, user data and
/// 64-bit user code (RPL 3).
pub const GDT_LIMIT: u16 = 7 * 8 - 1;
pub const IDTR: usize = 0x5f0;
pub const IDT: usize = 0x600;
pub const HANDLERS: usize = 0x2000;
pub const HANDLER_SIZE: usize = 0x20;
pub const PML4: usize = 0x9000;
/// The stack the CPU switches to on an interrupt from user mode.
pub const KERNEL_STACK: u64 = 0x7000;

/// 64-bit long mode as Linux runs it: a GDT with Linux's selectors
/// (kernel code 0x10, data 0x18, user data 0x2b, user code 0x33), page
/// tables mapping the first 2 MiB one to one (user-accessible), RSP0 in
/// the TSS the vCPU starts with (base 0), and an IDT whose gates 0..=
/// `last_vector` lead to `handler(vector)` at `HANDLERS + vector *
/// HANDLER_SIZE`; gate 0x80 may be used from user mode.
pub fn write_long_mode_tables(ram: &mut Ram, last_vector: u8, handler: impl Fn(u8) -> Vec<u8>) {
    let gdt: [u64; 7] = [
        0,
        0,
        0x00af_9b00_0000_ffff,
        0x00cf_9300_0000_ffff,
        0,
        0x00cf_f300_0000_ffff,
        0x00af_fb00_0000_ffff,
    ];
    for (i, d) in gdt.iter().enumerate() {
        ram.write(GDT + i * 8, &d.to_le_bytes());
    }
    ram.write(4, &KERNEL_STACK.to_le_bytes()); // TSS.RSP0
    ram.write(PML4, &((PML4 as u64 + 0x1000) | 7).to_le_bytes());
    ram.write(PML4 + 0x1000, &((PML4 as u64 + 0x2000) | 7).to_le_bytes());
    ram.write(PML4 + 0x2000, &0x87u64.to_le_bytes()); // 2 MiB page at 0
                                                      // The IDT's pseudo-descriptor: limit (16 bits), base (64 bits).
    let mut idtr = ((usize::from(last_vector) + 1) * 16 - 1).to_le_bytes()[..2].to_vec();
    idtr.extend((IDT as u64).to_le_bytes());
    ram.write(IDTR, &idtr);
    for vector in 0..=last_vector {
        let at = HANDLERS + usize::from(vector) * HANDLER_SIZE;
        let code = handler(vector);
        assert!(code.len() <= HANDLER_SIZE);
        ram.write(at, &code);
        // 64-bit interrupt gate, selector 0x10, present, DPL 0 (3 for 0x80).
        let kind: u64 = if vector == 0x80 { 0xee00 } else { 0x8e00 };
        let at = at as u64;
        let low = (at & 0xffff) | (0x10 << 16) | (kind << 32) | (((at >> 16) & 0xffff) << 48);
        ram.write(IDT + usize::from(vector) * 16, &low.to_le_bytes());
        ram.write(
            IDT + usize::from(vector) * 16 + 8,
            &(at >> 32).to_le_bytes(),
        );
    }
}
