//! CPUID for one vCPU: KVM's supported CPUID passed through, with the
//! per-vCPU fields fixed up (APIC ids, logical processor count) and the
//! hypervisor-present bit set.
//!
//! Enters as the supported table from `KVM_GET_SUPPORTED_CPUID`; leaves as
//! a new table for `KVM_SET_CPUID2`.

use kvm_bindings::CpuId;

/// CPUID.1:ECX bit 31: running under a hypervisor.
const ECX_HYPERVISOR: u32 = 1 << 31;
/// CPUID.1:EDX bit 28: HTT, "EBX[23:16] is valid".
const EDX_HTT: u32 = 1 << 28;

/// Returns the CPUID table for vCPU `id` of `count`.
pub fn for_vcpu(supported: &CpuId, id: u8, count: u8) -> CpuId {
    let mut cpuid = supported.clone();
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => {
                // Initial APIC id in EBX[31:24], logical processors in
                // EBX[23:16], CLFLUSH line size (in 8-byte units) in EBX[15:8].
                e.ebx = (u32::from(id) << 24) | (u32::from(count) << 16) | (8 << 8);
                e.ecx |= ECX_HYPERVISOR;
                if count > 1 {
                    e.edx |= EDX_HTT;
                }
            }
            // Extended topology: EDX is the x2APIC id of this CPU.
            0xb | 0x1f => e.edx = u32::from(id),
            _ => {}
        }
    }
    cpuid
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn apic_id_and_hypervisor_bit_are_set() {
        let entries = [
            kvm_cpuid_entry2 {
                function: 1,
                ebx: 0xffff_ffff,
                ..Default::default()
            },
            kvm_cpuid_entry2 {
                function: 0xb,
                edx: 7,
                ..Default::default()
            },
        ];
        let supported = CpuId::from_entries(&entries).unwrap();
        let c = for_vcpu(&supported, 3, 4);
        let e1 = c.as_slice()[0];
        assert_eq!(e1.ebx >> 24, 3);
        assert_eq!((e1.ebx >> 16) & 0xff, 4);
        assert_ne!(e1.ecx & ECX_HYPERVISOR, 0);
        assert_ne!(e1.edx & EDX_HTT, 0);
        assert_eq!(c.as_slice()[1].edx, 3);
    }
}
