//! `KVM_EXIT_INTERNAL_ERROR`: saying what failed, and completing the two
//! instructions that KVM's instruction emulator gives up on although a
//! guest kernel runs them as a matter of course.
//!
//! Some hosts' KVM runs guest code through its instruction emulator
//! (docs/linux-guests.md). An instruction that emulator does not know
//! ends `KVM_RUN` with `KVM_EXIT_INTERNAL_ERROR`, suberror
//! `KVM_INTERNAL_ERROR_EMULATION`, and, with the flag
//! `KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES` in the first data
//! word, the bytes it fetched: one byte count and up to 15 bytes in the
//! next two words, little-endian. [`InternalError::decode`] turns the
//! data words into a report; the vCPU adds RIP.
//!
//! What happens next ([`complete`]):
//! - `INT3` (`cc`): a trap. RIP moves past it and #BP (vector 3) is
//!   injected with `KVM_SET_VCPU_EVENTS`, so the guest's handler sees the
//!   return address the hardware would have pushed (Linux's int3
//!   self-test and its text patching rely on that).
//! - `FWAIT` (`9b`, Linux's `fpu__drop()` on every task exit): its
//!   architectural effect. #NM (vector 7) if CR0.TS and CR0.MP are both
//!   set; else #MF (vector 16) if the x87 status word holds an exception
//!   flag whose mask bit in the control word is clear; else nothing, and
//!   RIP moves past it. Faults leave RIP on the FWAIT. With CR0.NE clear a
//!   pending exception would be signalled on the FERR# pin, which the VMM
//!   does not model: that case stops the VM.
//! - Anything else, or an exception already pending when one of those two
//!   fails: the VM stops with the report (suberror, RIP, instruction
//!   bytes, further data words). The VMM never retries an instruction.

use std::fmt;

use kvm_bindings::{
    KVM_INTERNAL_ERROR_DELIVERY_EV, KVM_INTERNAL_ERROR_EMULATION,
    KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES, KVM_INTERNAL_ERROR_SIMUL_EX,
    KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON,
};

use crate::error::Result;

const INT3: u8 = 0xcc;
const FWAIT: u8 = 0x9b;

/// Exception vectors the VMM may inject.
pub const VECTOR_BP: u8 = 3;
pub const VECTOR_NM: u8 = 7;
pub const VECTOR_MF: u8 = 16;

const CR0_MP: u64 = 1 << 1;
const CR0_TS: u64 = 1 << 3;
const CR0_NE: u64 = 1 << 5;
/// The six x87 exception flags (status word) and masks (control word).
const X87_EXCEPTIONS: u16 = 0x3f;

/// A `KVM_EXIT_INTERNAL_ERROR` as KVM reported it, with where the guest
/// stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InternalError {
    pub suberror: u32,
    /// The bytes KVM's emulator fetched at RIP (emulation failures that
    /// carry them).
    pub instruction: Option<Vec<u8>>,
    /// The data words not decoded above.
    pub data: Vec<u64>,
    /// RIP (`KVM_GET_REGS`), when it could be read.
    pub rip: Option<u64>,
    /// Why the VMM did not complete the instruction itself, when it is
    /// one of those it completes.
    pub not_completed: Option<&'static str>,
}

impl InternalError {
    /// Decodes `kvm_run.internal`: the suberror and its `ndata` words.
    pub fn decode(suberror: u32, data: &[u64]) -> InternalError {
        let flagged = data.first().is_some_and(|f| {
            f & u64::from(KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES) != 0
        });
        if suberror == KVM_INTERNAL_ERROR_EMULATION && flagged && data.len() >= 3 {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&data[1].to_le_bytes());
            bytes[8..].copy_from_slice(&data[2].to_le_bytes());
            let len = usize::from(bytes[0]).min(15);
            InternalError {
                suberror,
                instruction: Some(bytes[1..1 + len].to_vec()),
                data: data[3..].to_vec(),
                rip: None,
                not_completed: None,
            }
        } else {
            InternalError {
                suberror,
                instruction: None,
                data: data.to_vec(),
                rip: None,
                not_completed: None,
            }
        }
    }

    /// The instruction the VMM completes itself, if this is its failure.
    fn completable(&self) -> Option<u8> {
        if self.suberror != KVM_INTERNAL_ERROR_EMULATION {
            return None;
        }
        match *self.instruction.as_deref()?.first()? {
            INT3 => Some(INT3),
            FWAIT => Some(FWAIT),
            _ => None,
        }
    }

    fn suberror_name(&self) -> &'static str {
        match self.suberror {
            KVM_INTERNAL_ERROR_EMULATION => {
                "emulation failure: KVM's instruction emulator cannot run this instruction"
            }
            KVM_INTERNAL_ERROR_SIMUL_EX => "an exception while delivering an exception",
            KVM_INTERNAL_ERROR_DELIVERY_EV => "an event could not be delivered",
            KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON => "an exit reason KVM did not expect",
            _ => "unknown suberror",
        }
    }
}

impl fmt::Display for InternalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KVM internal error, {} (suberror {})",
            self.suberror_name(),
            self.suberror
        )?;
        match self.rip {
            Some(rip) => write!(f, " at RIP {rip:#x}")?,
            None => write!(f, " (RIP unreadable)")?,
        }
        if let Some(insn) = &self.instruction {
            write!(f, ", instruction bytes")?;
            for b in insn {
                write!(f, " {b:02x}")?;
            }
        }
        if !self.data.is_empty() {
            write!(f, ", data")?;
            for w in &self.data {
                write!(f, " {w:#x}")?;
            }
        }
        if let Some(why) = self.not_completed {
            write!(f, "; not completed: {why}")?;
        }
        Ok(())
    }
}

/// What the VMM did in the guest's stead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// INT3 at `rip`: RIP moved past it, #BP delivered.
    Breakpoint { rip: u64 },
    /// FWAIT at `rip` with nothing to signal: RIP moved past it.
    Fwait { rip: u64 },
    /// FWAIT at `rip` faulted with `vector` (#NM or #MF), RIP unchanged.
    FwaitFault { rip: u64, vector: u8 },
}

impl fmt::Display for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Completion::Breakpoint { rip } => {
                write!(f, "INT3 at {rip:#x} failed emulation: #BP delivered")
            }
            Completion::Fwait { rip } => write!(f, "FWAIT at {rip:#x} failed emulation: completed"),
            Completion::FwaitFault { rip, vector } => {
                write!(
                    f,
                    "FWAIT at {rip:#x} failed emulation: vector {vector} delivered"
                )
            }
        }
    }
}

/// The end of an internal-error exit.
#[derive(Debug)]
pub enum InternalErrorOutcome {
    /// The VMM completed the instruction; the guest may run on.
    Completed(Completion),
    /// The VM cannot go on; the report says why.
    Fatal(InternalError),
}

/// What FWAIT does with this CR0, x87 status word and control word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FwaitEffect {
    Fault(u8),
    Continue,
    /// A pending exception with CR0.NE clear (signalled on FERR#).
    Ferr,
}

fn fwait_effect(cr0: u64, fsw: u16, fcw: u16) -> FwaitEffect {
    if cr0 & CR0_TS != 0 && cr0 & CR0_MP != 0 {
        FwaitEffect::Fault(VECTOR_NM)
    } else if fsw & !fcw & X87_EXCEPTIONS != 0 {
        if cr0 & CR0_NE != 0 {
            FwaitEffect::Fault(VECTOR_MF)
        } else {
            FwaitEffect::Ferr
        }
    } else {
        FwaitEffect::Continue
    }
}

/// The state of a stopped vCPU that completing INT3 or FWAIT reads and
/// changes. The vCPU implements it, so this module sits below the vCPU
/// and knows nothing of how a vCPU is run.
pub(crate) trait CompletingCpu {
    /// Moves RIP past an instruction of `len` bytes.
    fn advance_rip(&self, len: u64) -> Result<()>;
    /// Injects exception `vector` (no error code) for the next entry;
    /// false, and nothing changed, if one is already pending.
    fn inject_exception(&self, vector: u8) -> Result<bool>;
    fn cr0(&self) -> Result<u64>;
    /// The x87 status word and control word.
    fn x87_status_and_control(&self) -> Result<(u16, u16)>;
}

/// Completes the instruction of `error` on `vcpu` if it is INT3 or FWAIT,
/// as the hardware would; anything else is fatal.
pub(crate) fn complete(
    vcpu: &impl CompletingCpu,
    mut error: InternalError,
) -> Result<InternalErrorOutcome> {
    let (Some(rip), Some(insn)) = (error.rip, error.completable()) else {
        return Ok(InternalErrorOutcome::Fatal(error));
    };
    let completion = if insn == INT3 {
        vcpu.advance_rip(1)?;
        if !vcpu.inject_exception(VECTOR_BP)? {
            error.not_completed = Some("an exception was already pending");
            return Ok(InternalErrorOutcome::Fatal(error));
        }
        Completion::Breakpoint { rip }
    } else {
        let (fsw, fcw) = vcpu.x87_status_and_control()?;
        match fwait_effect(vcpu.cr0()?, fsw, fcw) {
            FwaitEffect::Continue => {
                vcpu.advance_rip(1)?;
                Completion::Fwait { rip }
            }
            FwaitEffect::Fault(vector) => {
                if !vcpu.inject_exception(vector)? {
                    error.not_completed = Some("an exception was already pending");
                    return Ok(InternalErrorOutcome::Fatal(error));
                }
                Completion::FwaitFault { rip, vector }
            }
            FwaitEffect::Ferr => {
                error.not_completed = Some(
                    "FWAIT with an unmasked x87 exception pending and CR0.NE clear \
                     (FERR# signalling is not modelled)",
                );
                return Ok(InternalErrorOutcome::Fatal(error));
            }
        }
    };
    Ok(InternalErrorOutcome::Completed(completion))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `data` words for an emulation failure with these instruction bytes.
    fn emulation_words(insn: &[u8]) -> Vec<u64> {
        let mut bytes = [0x90u8; 16];
        bytes[0] = insn.len() as u8;
        bytes[1..1 + insn.len()].copy_from_slice(insn);
        vec![
            1,
            u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            u64::from_le_bytes(bytes[8..].try_into().unwrap()),
            0x1234,
        ]
    }

    #[test]
    fn decodes_instruction_bytes_and_extra_data() {
        let e = InternalError::decode(1, &emulation_words(&[0xf0, 0x48, 0x0f, 0xc7, 0x4d, 0x20]));
        assert_eq!(
            e.instruction.as_deref(),
            Some(&[0xf0, 0x48, 0x0f, 0xc7, 0x4d, 0x20][..])
        );
        assert_eq!(e.data, vec![0x1234]);
        let full = InternalError::decode(1, &emulation_words(&[0x90; 15]));
        assert_eq!(full.instruction.unwrap().len(), 15);
        let e = InternalError {
            rip: Some(0xffff_ffff_8100_0000),
            ..e
        };
        let text = e.to_string();
        assert!(text.contains("suberror 1"), "{text}");
        assert!(text.contains("RIP 0xffffffff81000000"), "{text}");
        assert!(
            text.contains("instruction bytes f0 48 0f c7 4d 20,"),
            "{text}"
        );
        assert!(text.contains("data 0x1234"), "{text}");
    }

    #[test]
    fn short_or_unflagged_data_carries_no_instruction() {
        // No flag: the words are only data.
        let e = InternalError::decode(1, &[0, 5, 6]);
        assert_eq!((e.instruction, e.data), (None, vec![0, 5, 6]));
        // Flag but too few words (a hostile or older KVM): no bytes read.
        assert!(InternalError::decode(1, &[1, 5]).instruction.is_none());
        // A byte count over 15 is clamped.
        let mut w = emulation_words(&[0xcc]);
        w[1] = (w[1] & !0xff) | 0xff;
        assert_eq!(InternalError::decode(1, &w).instruction.unwrap().len(), 15);
        // Another suberror never has instruction bytes.
        let e = InternalError::decode(3, &emulation_words(&[0xcc]));
        assert!(e.instruction.is_none());
        assert!(e.to_string().contains("could not be delivered"));
    }

    #[test]
    fn only_int3_and_fwait_emulation_failures_are_completable() {
        let int3 = InternalError::decode(1, &emulation_words(&[0xcc]));
        assert_eq!(int3.completable(), Some(INT3));
        let fwait = InternalError::decode(1, &emulation_words(&[0x9b, 0xdf, 0xe0]));
        assert_eq!(fwait.completable(), Some(FWAIT));
        for other in [
            &[0x0f, 0xae, 0x2f][..],
            &[0xf3, 0x48, 0x0f, 0xb8, 0xc7],
            &[0x66, 0xcc],
            &[],
        ] {
            let e = InternalError::decode(1, &emulation_words(other));
            assert_eq!(e.completable(), None, "{other:x?}");
        }
        // INT3's byte in another suberror's data is not an INT3.
        assert_eq!(
            InternalError::decode(2, &[1, 0xcc01, 0]).completable(),
            None
        );
    }

    #[test]
    fn fwait_follows_the_architecture() {
        let ne = CR0_NE;
        // TS and MP: #NM, whatever the x87 state.
        assert_eq!(
            fwait_effect(ne | CR0_TS | CR0_MP, 0x1, 0),
            FwaitEffect::Fault(VECTOR_NM)
        );
        // TS without MP: FWAIT ignores TS.
        assert_eq!(fwait_effect(ne | CR0_TS, 0, 0x37f), FwaitEffect::Continue);
        // Zero-divide flagged and unmasked: #MF; masked: nothing.
        assert_eq!(
            fwait_effect(ne, 0x0004, 0x037b),
            FwaitEffect::Fault(VECTOR_MF)
        );
        assert_eq!(fwait_effect(ne, 0x0004, 0x037f), FwaitEffect::Continue);
        // Flags outside the six exceptions (ES, C0..C3, TOP) do not count.
        assert_eq!(fwait_effect(ne, 0xff80, 0x0340), FwaitEffect::Continue);
        // Pending with CR0.NE clear: FERR#, not modelled.
        assert_eq!(fwait_effect(0, 0x0001, 0x0340), FwaitEffect::Ferr);
    }
}
