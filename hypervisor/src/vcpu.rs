//! One KVM vCPU: CPUID, MSRs, FPU and LAPIC set-up, the register state for
//! our two boot entry modes, and the run loop's exit decoding.
//!
//! Entry modes:
//! - [`Vcpu::enter_protected_mode`]: 32-bit flat protected mode, paging
//!   off, `%ebx` pointing at the PVH start info (the PVH boot protocol).
//! - [`Vcpu::enter_long_mode`]: 64-bit mode with identity-mapped page
//!   tables the VMM wrote, `%rsi` pointing at the zero page (the 64-bit
//!   Linux boot protocol).
//!
//! [`Vcpu::run`] returns a [`VcpuExit`]: port and MMIO accesses the VMM must
//! emulate, or the events that end the VM. After
//! [`VcpuExit::InternalError`], [`Vcpu::handle_internal_error`] reads
//! KVM's report and completes the instructions `emulation` knows.

use kvm_bindings::{
    kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, Msrs, KVM_SYSTEM_EVENT_CRASH,
    KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN,
};
use kvm_ioctls::{VcpuExit as KvmExit, VcpuFd};

use crate::emulation::{self, CompletingCpu, InternalError, InternalErrorOutcome};
use crate::error::{HypervisorError, Result};

/// Why a `KVM_EXIT_SYSTEM_EVENT` happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SystemEvent {
    Shutdown,
    Reset,
    Crash,
    Other(u32),
}

/// A vCPU exit the VMM has to act on.
#[derive(Debug)]
pub enum VcpuExit<'a> {
    /// `in` from a port: fill the slice.
    IoIn(u16, &'a mut [u8]),
    /// `out` to a port.
    IoOut(u16, &'a [u8]),
    /// Load from an unmapped guest physical address: fill the slice.
    MmioRead(u64, &'a mut [u8]),
    /// Store to an unmapped guest physical address.
    MmioWrite(u64, &'a [u8]),
    /// The guest halted with interrupts off, or the in-kernel LAPIC is
    /// absent (never with our irqchip unless the CPU is dead).
    Hlt,
    /// Triple fault.
    Shutdown,
    SystemEvent(SystemEvent),
    /// `KVM_RUN` was interrupted by a signal or `immediate_exit`.
    Interrupted,
    /// `KVM_EXIT_INTERNAL_ERROR`: call [`Vcpu::handle_internal_error`]
    /// before running the vCPU again.
    InternalError,
    /// Anything else; the string says what, for the fatal error message.
    Unhandled(String),
}

// Control register and EFER bits.
const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

// MSR indices.
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;

// LAPIC register offsets and delivery modes.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

pub struct Vcpu {
    fd: VcpuFd,
    id: u8,
}

impl Vcpu {
    pub(crate) fn new(fd: VcpuFd, id: u8) -> Self {
        Vcpu { fd, id }
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    pub(crate) fn set_cpuid(&self, cpuid: &kvm_bindings::CpuId) -> Result<()> {
        self.fd
            .set_cpuid2(cpuid)
            .map_err(|source| HypervisorError::SetCpuid {
                id: self.id,
                source,
            })
    }

    /// The CPUID table KVM holds for this vCPU (`KVM_GET_CPUID2`).
    pub(crate) fn cpuid(&self) -> Result<kvm_bindings::CpuId> {
        self.fd
            .get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(|source| HypervisorError::GetCpuid {
                id: self.id,
                source,
            })
    }

    pub(crate) fn setup_msrs(&self) -> Result<()> {
        let entry = |index, data| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        };
        let entries = [
            entry(MSR_IA32_SYSENTER_CS, 0),
            entry(MSR_IA32_SYSENTER_ESP, 0),
            entry(MSR_IA32_SYSENTER_EIP, 0),
            entry(MSR_STAR, 0),
            entry(MSR_CSTAR, 0),
            entry(MSR_KERNEL_GS_BASE, 0),
            entry(MSR_SYSCALL_MASK, 0),
            entry(MSR_LSTAR, 0),
            entry(MSR_IA32_TSC, 0),
            entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        ];
        let msrs = Msrs::from_entries(&entries).map_err(|_| HypervisorError::BuildMsrs)?;
        let set = self
            .fd
            .set_msrs(&msrs)
            .map_err(|source| HypervisorError::MsrIoctl {
                id: self.id,
                source,
            })?;
        if set != entries.len() {
            return Err(HypervisorError::SetMsrs {
                id: self.id,
                set,
                wanted: entries.len(),
            });
        }
        Ok(())
    }

    pub(crate) fn setup_fpu(&self) -> Result<()> {
        let fpu = kvm_fpu {
            fcw: 0x37f,
            mxcsr: 0x1f80,
            ..Default::default()
        };
        self.fd
            .set_fpu(&fpu)
            .map_err(|source| HypervisorError::Fpu {
                id: self.id,
                source,
            })
    }

    /// LINT0 as ExtINT (the PIC), LINT1 as NMI: what firmware leaves for
    /// an OS that later switches to the IOAPIC.
    pub(crate) fn setup_lapic(&self) -> Result<()> {
        let err = |source| HypervisorError::Lapic {
            id: self.id,
            source,
        };
        let mut lapic = self.fd.get_lapic().map_err(err)?;
        for (off, mode) in [(APIC_LVT0, APIC_MODE_EXTINT), (APIC_LVT1, APIC_MODE_NMI)] {
            let regs = &mut lapic.regs;
            let mut raw = [0u8; 4];
            for (i, b) in raw.iter_mut().enumerate() {
                // Bit-for-bit reinterpretation of the C char array.
                *b = regs[off + i] as u8;
            }
            let v = u32::from_le_bytes(raw);
            let v = (v & !0x700) | (mode << 8);
            for (i, b) in v.to_le_bytes().iter().enumerate() {
                regs[off + i] = *b as _;
            }
        }
        self.fd.set_lapic(&lapic).map_err(err)
    }

    fn reg_err(&self) -> impl Fn(vmm_sys_util::errno::Error) -> HypervisorError {
        let id = self.id;
        move |source| HypervisorError::Registers { id, source }
    }

    /// The registers every entry state shares: flat 4 GiB code (64-bit
    /// if `long_mode`) and data segments, a task register, flags 2 and no
    /// stack; `sregs_fix` and `regs_fix` add the protocol's specifics.
    fn set_entry_state(
        &self,
        long_mode: bool,
        entry: u64,
        sregs_fix: impl FnOnce(&mut kvm_sregs),
        regs_fix: impl FnOnce(&mut kvm_regs),
    ) -> Result<()> {
        let mut sregs = self.fd.get_sregs().map_err(self.reg_err())?;
        sregs.cs = flat_segment(0x10, 0xb, long_mode);
        let data = flat_segment(0x18, 0x3, false);
        sregs.ds = data;
        sregs.es = data;
        sregs.fs = data;
        sregs.gs = data;
        sregs.ss = data;
        sregs.tr = task_segment();
        sregs_fix(&mut sregs);
        self.fd.set_sregs(&sregs).map_err(self.reg_err())?;
        let mut regs = self.fd.get_regs().map_err(self.reg_err())?;
        regs.rflags = 2;
        regs.rip = entry;
        regs.rsp = 0;
        regs_fix(&mut regs);
        self.fd.set_regs(&regs).map_err(self.reg_err())
    }

    /// 32-bit flat protected mode, paging off, at `entry` with `%ebx` =
    /// `start_info` (the PVH boot protocol's machine state).
    pub fn enter_protected_mode(&self, entry: u64, start_info: u64) -> Result<()> {
        self.set_entry_state(
            false,
            entry,
            |sregs| {
                sregs.cr0 = CR0_PE | CR0_ET;
                sregs.cr4 = 0;
                sregs.efer = 0;
            },
            |regs| regs.rbx = start_info,
        )
    }

    /// 64-bit long mode at `entry` with paging on (`cr3` = the PML4 the VMM
    /// wrote), a GDT at `gdt_base` (`gdt_limit`), `%rsi` = `boot_params`.
    pub fn enter_long_mode(
        &self,
        entry: u64,
        boot_params: u64,
        cr3: u64,
        gdt_base: u64,
        gdt_limit: u16,
    ) -> Result<()> {
        self.set_entry_state(
            true,
            entry,
            |sregs| {
                sregs.gdt.base = gdt_base;
                sregs.gdt.limit = gdt_limit;
                sregs.cr3 = cr3;
                sregs.cr4 = CR4_PAE;
                sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
                sregs.efer = EFER_LME | EFER_LMA;
            },
            |regs| regs.rsi = boot_params,
        )
    }

    pub fn set_immediate_exit(&mut self, on: bool) {
        self.fd.set_kvm_immediate_exit(u8::from(on));
    }

    /// Runs the vCPU until the next exit the VMM must handle.
    pub fn run(&mut self) -> Result<VcpuExit<'_>> {
        let id = self.id;
        match self.fd.run() {
            Ok(exit) => Ok(match exit {
                KvmExit::IoIn(p, d) => VcpuExit::IoIn(p, d),
                KvmExit::IoOut(p, d) => VcpuExit::IoOut(p, d),
                KvmExit::MmioRead(a, d) => VcpuExit::MmioRead(a, d),
                KvmExit::MmioWrite(a, d) => VcpuExit::MmioWrite(a, d),
                KvmExit::Hlt => VcpuExit::Hlt,
                KvmExit::Shutdown => VcpuExit::Shutdown,
                KvmExit::Intr => VcpuExit::Interrupted,
                KvmExit::SystemEvent(t, _) => VcpuExit::SystemEvent(match t {
                    KVM_SYSTEM_EVENT_SHUTDOWN => SystemEvent::Shutdown,
                    KVM_SYSTEM_EVENT_RESET => SystemEvent::Reset,
                    KVM_SYSTEM_EVENT_CRASH => SystemEvent::Crash,
                    o => SystemEvent::Other(o),
                }),
                KvmExit::FailEntry(reason, cpu) => VcpuExit::Unhandled(format!(
                    "VM entry failed (hardware reason {reason:#x}, cpu {cpu})"
                )),
                KvmExit::InternalError => VcpuExit::InternalError,
                other => VcpuExit::Unhandled(format!("{other:?}")),
            }),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                Ok(VcpuExit::Interrupted)
            }
            Err(source) => Err(HypervisorError::Run { id, source }),
        }
    }
}

impl Vcpu {
    /// After [`VcpuExit::InternalError`]: reads KVM's report (suberror,
    /// instruction bytes, data) and RIP, then completes INT3 and FWAIT as
    /// the hardware would (see `emulation`); anything else comes back as
    /// [`InternalErrorOutcome::Fatal`] with the report.
    pub fn handle_internal_error(&mut self) -> Result<InternalErrorOutcome> {
        let run = self.fd.get_kvm_run();
        // SAFETY: KVM_RUN just returned KVM_EXIT_INTERNAL_ERROR, for which
        // KVM fills the `internal` member of the exit union; its fields are
        // plain integers, valid for any bit pattern.
        let internal = unsafe { run.__bindgen_anon_1.internal };
        let ndata = (internal.ndata as usize).min(internal.data.len());
        let mut error = InternalError::decode(internal.suberror, &internal.data[..ndata]);
        error.rip = self.fd.get_regs().ok().map(|r| r.rip);
        emulation::complete(self, error)
    }
}

/// What completing an instruction reads and changes on a stopped vCPU.
impl CompletingCpu for Vcpu {
    /// Moves RIP past an instruction of `len` bytes, wrapping as the
    /// current code segment's operand size does.
    fn advance_rip(&self, len: u64) -> Result<()> {
        let sregs = self.fd.get_sregs().map_err(self.reg_err())?;
        let mut regs = self.fd.get_regs().map_err(self.reg_err())?;
        let next = regs.rip.wrapping_add(len);
        regs.rip = if sregs.efer & EFER_LMA != 0 && sregs.cs.l != 0 {
            next
        } else if sregs.cs.db != 0 {
            next & 0xffff_ffff
        } else {
            next & 0xffff
        };
        self.fd.set_regs(&regs).map_err(self.reg_err())
    }

    /// Injects exception `vector` (no error code) for the next entry;
    /// false, and nothing changed, if an exception is already pending or
    /// being injected.
    fn inject_exception(&self, vector: u8) -> Result<bool> {
        let err = |source| HypervisorError::Events {
            id: self.id,
            source,
        };
        let mut events = self.fd.get_vcpu_events().map_err(err)?;
        if events.exception.injected != 0 || events.exception.pending != 0 {
            return Ok(false);
        }
        events.exception.injected = 1;
        events.exception.nr = vector;
        events.exception.has_error_code = 0;
        events.exception.error_code = 0;
        events.exception_has_payload = 0;
        events.exception_payload = 0;
        self.fd.set_vcpu_events(&events).map_err(err)?;
        Ok(true)
    }

    fn cr0(&self) -> Result<u64> {
        Ok(self.fd.get_sregs().map_err(self.reg_err())?.cr0)
    }

    /// The x87 status word and control word, from the legacy region of
    /// `KVM_GET_XSAVE` (FCW in bytes 0-1, FSW in bytes 2-3). Not
    /// `KVM_GET_FPU`: on a host whose KVM emulates guest code it returned
    /// a stale status word once the guest had changed it again
    /// (hypervisor/tests/guest_instructions.rs catches that).
    fn x87_status_and_control(&self) -> Result<(u16, u16)> {
        let xsave = self.fd.get_xsave().map_err(|source| HypervisorError::Fpu {
            id: self.id,
            source,
        })?;
        let word = xsave.region[0];
        Ok(((word >> 16) as u16, word as u16))
    }
}

impl Vcpu {
    /// The general, control and segment registers, one line each group,
    /// for a fatal exit's log.
    pub fn register_dump(&self) -> String {
        let (regs, sregs) = match (self.fd.get_regs(), self.fd.get_sregs()) {
            (Ok(r), Ok(s)) => (r, s),
            (Err(e), _) | (_, Err(e)) => return format!("registers unreadable: {e}"),
        };
        let seg = |name: &str, s: &kvm_segment| {
            format!(
                "{name}={:#x} base={:#x} limit={:#x} type={:#x} l={} db={} dpl={}",
                s.selector, s.base, s.limit, s.type_, s.l, s.db, s.dpl
            )
        };
        format!(
            "rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} rbp={:#x} rsp={:#x}\n\
             r8={:#x} r9={:#x} r10={:#x} r11={:#x} r12={:#x} r13={:#x} r14={:#x} r15={:#x}\n\
             rip={:#x} rflags={:#x}\n\
             cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} cr8={:#x} efer={:#x} apic_base={:#x}\n\
             {}\n{}\n{}\n\
             gdt base={:#x} limit={:#x}, idt base={:#x} limit={:#x}",
            regs.rax,
            regs.rbx,
            regs.rcx,
            regs.rdx,
            regs.rsi,
            regs.rdi,
            regs.rbp,
            regs.rsp,
            regs.r8,
            regs.r9,
            regs.r10,
            regs.r11,
            regs.r12,
            regs.r13,
            regs.r14,
            regs.r15,
            regs.rip,
            regs.rflags,
            sregs.cr0,
            sregs.cr2,
            sregs.cr3,
            sregs.cr4,
            sregs.cr8,
            sregs.efer,
            sregs.apic_base,
            seg("cs", &sregs.cs),
            seg("ss", &sregs.ss),
            seg("tr", &sregs.tr),
            sregs.gdt.base,
            sregs.gdt.limit,
            sregs.idt.base,
            sregs.idt.limit,
        )
    }
}

/// A flat 4 GiB code or data segment with selector `sel` and `type_`.
fn flat_segment(sel: u16, type_: u8, long: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: sel,
        type_,
        present: 1,
        dpl: 0,
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// A busy 32-bit TSS, as VM entry requires a usable task register.
fn task_segment() -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0x67,
        selector: 0x20,
        type_: 0xb,
        present: 1,
        dpl: 0,
        db: 0,
        s: 0,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}
