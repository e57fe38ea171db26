//! The CPU model: which CPUID features the guest is shown.
//!
//! The default ([`BaseModel::Host`]) passes KVM's supported CPUID through.
//! [`BaseModel::X86_64V1`] is the x86-64 psABI's baseline level (in the
//! spirit of QEMU's `qemu64`): the instruction set every 64-bit x86 CPU
//! has (x87, CMOV, CX8, MMX, FXSR, SSE, SSE2, SYSCALL, NX, LM), plus the
//! platform bits a KVM guest needs (x2APIC, TSC deadline, hypervisor
//! present, KVM's paravirtual leaves); every later extension (SSE3,
//! CX16, POPCNT, XSAVE, AVX, leaf 7, ...) is hidden. [`CpuModel::hidden`]
//! removes named features on top of either. Two reasons to hide:
//! migration between unlike hosts (the guest must not use what the
//! destination lacks), and hosts whose KVM emulates guest code and cannot
//! emulate every instruction the host CPU has (docs/linux-guests.md).
//!
//! [`CpuModel::apply`] edits the table before `KVM_SET_CPUID2`;
//! [`CpuModel::still_visible`] compares the model with what the vCPU
//! reports afterwards (`KVM_GET_CPUID2`), because some hosts' KVM puts
//! features back (the VMM then warns with a `clearcpuid=` the guest
//! kernel can use instead). Feature names are Linux's (`/proc/cpuinfo`,
//! and so `clearcpuid=`).

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reg {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// One CPUID feature bit with Linux's name for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    pub name: &'static str,
    leaf: u32,
    subleaf: u32,
    reg: Reg,
    bit: u8,
}

const fn f(name: &'static str, leaf: u32, subleaf: u32, reg: Reg, bit: u8) -> Feature {
    Feature {
        name,
        leaf,
        subleaf,
        reg,
        bit,
    }
}

use Reg::{Eax, Ebx, Ecx, Edx};

/// The features `hide=` knows: the instruction-set extensions after the
/// x86-64 baseline, a few platform features, and KVM's paravirtual
/// features (which a host may implement badly, docs/linux-guests.md).
pub const FEATURES: &[Feature] = &[
    f("pni", 1, 0, Ecx, 0),
    f("pclmulqdq", 1, 0, Ecx, 1),
    f("ssse3", 1, 0, Ecx, 9),
    f("fma", 1, 0, Ecx, 12),
    f("cx16", 1, 0, Ecx, 13),
    f("pcid", 1, 0, Ecx, 17),
    f("sse4_1", 1, 0, Ecx, 19),
    f("sse4_2", 1, 0, Ecx, 20),
    f("x2apic", 1, 0, Ecx, 21),
    f("movbe", 1, 0, Ecx, 22),
    f("popcnt", 1, 0, Ecx, 23),
    f("tsc_deadline_timer", 1, 0, Ecx, 24),
    f("aes", 1, 0, Ecx, 25),
    f("xsave", 1, 0, Ecx, 26),
    f("avx", 1, 0, Ecx, 28),
    f("f16c", 1, 0, Ecx, 29),
    f("rdrand", 1, 0, Ecx, 30),
    f("fsgsbase", 7, 0, Ebx, 0),
    f("bmi1", 7, 0, Ebx, 3),
    f("hle", 7, 0, Ebx, 4),
    f("avx2", 7, 0, Ebx, 5),
    f("smep", 7, 0, Ebx, 7),
    f("bmi2", 7, 0, Ebx, 8),
    f("erms", 7, 0, Ebx, 9),
    f("invpcid", 7, 0, Ebx, 10),
    f("rtm", 7, 0, Ebx, 11),
    f("avx512f", 7, 0, Ebx, 16),
    f("avx512dq", 7, 0, Ebx, 17),
    f("rdseed", 7, 0, Ebx, 18),
    f("adx", 7, 0, Ebx, 19),
    f("smap", 7, 0, Ebx, 20),
    f("avx512ifma", 7, 0, Ebx, 21),
    f("clflushopt", 7, 0, Ebx, 23),
    f("clwb", 7, 0, Ebx, 24),
    f("avx512cd", 7, 0, Ebx, 28),
    f("sha_ni", 7, 0, Ebx, 29),
    f("avx512bw", 7, 0, Ebx, 30),
    f("avx512vl", 7, 0, Ebx, 31),
    f("avx512vbmi", 7, 0, Ecx, 1),
    f("umip", 7, 0, Ecx, 2),
    f("pku", 7, 0, Ecx, 3),
    f("waitpkg", 7, 0, Ecx, 5),
    f("avx512_vbmi2", 7, 0, Ecx, 6),
    f("gfni", 7, 0, Ecx, 8),
    f("vaes", 7, 0, Ecx, 9),
    f("vpclmulqdq", 7, 0, Ecx, 10),
    f("avx512_vnni", 7, 0, Ecx, 11),
    f("avx512_bitalg", 7, 0, Ecx, 12),
    f("avx512_vpopcntdq", 7, 0, Ecx, 14),
    f("la57", 7, 0, Ecx, 16),
    f("rdpid", 7, 0, Ecx, 22),
    f("movdiri", 7, 0, Ecx, 27),
    f("movdir64b", 7, 0, Ecx, 28),
    f("fsrm", 7, 0, Edx, 4),
    f("avx512_vp2intersect", 7, 0, Edx, 8),
    f("serialize", 7, 0, Edx, 14),
    f("amx_bf16", 7, 0, Edx, 22),
    f("avx512_fp16", 7, 0, Edx, 23),
    f("amx_tile", 7, 0, Edx, 24),
    f("amx_int8", 7, 0, Edx, 25),
    f("avx_vnni", 7, 1, Eax, 4),
    f("avx512_bf16", 7, 1, Eax, 5),
    f("xsaveopt", 0xd, 1, Eax, 0),
    f("xsavec", 0xd, 1, Eax, 1),
    f("xgetbv1", 0xd, 1, Eax, 2),
    f("xsaves", 0xd, 1, Eax, 3),
    f("lahf_lm", 0x8000_0001, 0, Ecx, 0),
    f("abm", 0x8000_0001, 0, Ecx, 5),
    f("sse4a", 0x8000_0001, 0, Ecx, 6),
    f("misalignsse", 0x8000_0001, 0, Ecx, 7),
    f("3dnowprefetch", 0x8000_0001, 0, Ecx, 8),
    f("xop", 0x8000_0001, 0, Ecx, 11),
    f("fma4", 0x8000_0001, 0, Ecx, 16),
    f("tbm", 0x8000_0001, 0, Ecx, 21),
    f("topoext", 0x8000_0001, 0, Ecx, 22),
    f("mmxext", 0x8000_0001, 0, Edx, 22),
    f("pdpe1gb", 0x8000_0001, 0, Edx, 26),
    f("rdtscp", 0x8000_0001, 0, Edx, 27),
    f("3dnowext", 0x8000_0001, 0, Edx, 30),
    f("3dnow", 0x8000_0001, 0, Edx, 31),
    // KVM's paravirtual features (CPUID 0x40000001 EAX, Linux's
    // KVM_FEATURE_* names in lower case).
    f("kvm_async_pf", KVM_FEATURES, 0, Eax, 4),
    f("kvm_steal_time", KVM_FEATURES, 0, Eax, 5),
    f("kvm_pv_eoi", KVM_FEATURES, 0, Eax, 6),
    f("kvm_pv_unhalt", KVM_FEATURES, 0, Eax, 7),
    f("kvm_pv_tlb_flush", KVM_FEATURES, 0, Eax, 9),
    f("kvm_pv_send_ipi", KVM_FEATURES, 0, Eax, 11),
    f("kvm_poll_control", KVM_FEATURES, 0, Eax, 12),
    f("kvm_pv_sched_yield", KVM_FEATURES, 0, Eax, 13),
];

/// KVM's feature leaf (the VMM offers KVM's leaves at 0x40000000).
const KVM_FEATURES: u32 = 0x4000_0001;

impl Feature {
    pub fn by_name(name: &str) -> Option<Feature> {
        FEATURES.iter().copied().find(|f| f.name == name)
    }

    fn mask(&self) -> u32 {
        1 << self.bit
    }

    fn is_set_in(&self, cpuid: &CpuId) -> bool {
        entry(cpuid, self.leaf, self.subleaf).is_some_and(|e| *reg(e, self.reg) & self.mask() != 0)
    }
}

/// The named base models of `--cpus model=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BaseModel {
    /// KVM's supported CPUID, as it is.
    #[default]
    Host,
    /// The x86-64 baseline (psABI level x86-64-v1).
    X86_64V1,
}

impl BaseModel {
    pub const NAMES: &'static str = "host, x86-64-v1";

    pub fn by_name(name: &str) -> Option<BaseModel> {
        match name {
            "host" => Some(BaseModel::Host),
            "x86-64-v1" => Some(BaseModel::X86_64V1),
            _ => None,
        }
    }
}

// x86-64-v1: CPUID.1:EDX fpu vme de pse tsc msr pae mce cx8 apic sep mtrr
// pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht.
const V1_LEAF1_EDX: u32 = 0x03ff
    | 1 << 11
    | 1 << 12
    | 1 << 13
    | 1 << 14
    | 1 << 15
    | 1 << 16
    | 1 << 17
    | 1 << 19
    | 1 << 23
    | 1 << 24
    | 1 << 25
    | 1 << 26
    | 1 << 28;
// CPUID.1:ECX: x2apic, tsc_deadline_timer, hypervisor (platform, not ISA).
const V1_LEAF1_ECX: u32 = 1 << 21 | 1 << 24 | 1 << 31;
// CPUID.80000001h:EDX: syscall, nx, lm, and AMD's copies of leaf 1's bits.
const V1_EXT1_EDX: u32 = 1 << 11 | 1 << 20 | 1 << 29 | (V1_LEAF1_EDX & 0x0183_f3ff);

/// The guest's CPU model: a base model and features hidden on top.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuModel {
    pub base: BaseModel,
    pub hidden: Vec<Feature>,
}

impl CpuModel {
    /// Hides what the model hides in `cpuid` (KVM's supported table).
    pub fn apply(&self, cpuid: &mut CpuId) {
        if self.base == BaseModel::X86_64V1 {
            for e in cpuid.as_mut_slice() {
                match e.function {
                    1 => {
                        e.ecx &= V1_LEAF1_ECX;
                        e.edx &= V1_LEAF1_EDX;
                    }
                    // Structured extended features and XSAVE state: none.
                    7 | 0xd => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = 0;
                        e.edx = 0;
                    }
                    0x8000_0001 => {
                        e.ecx = 0;
                        e.edx &= V1_EXT1_EDX;
                    }
                    _ => {}
                }
            }
        }
        for feature in &self.hidden {
            if let Some(e) = entry_mut(cpuid, feature.leaf, feature.subleaf) {
                *reg_mut(e, feature.reg) &= !feature.mask();
            }
        }
    }

    /// Whether the model hides `feature`.
    fn hides(&self, feature: &Feature) -> bool {
        if self.hidden.contains(feature) {
            return true;
        }
        match self.base {
            BaseModel::Host => false,
            BaseModel::X86_64V1 => {
                let keep = match (feature.leaf, feature.reg) {
                    (1, Reg::Ecx) => V1_LEAF1_ECX,
                    (1, Reg::Edx) => V1_LEAF1_EDX,
                    (0x8000_0001, Reg::Ecx) | (7, _) | (0xd, _) => 0,
                    (0x8000_0001, Reg::Edx) => V1_EXT1_EDX,
                    // KVM's leaves are not the instruction set: kept.
                    _ => !0,
                };
                keep & feature.mask() == 0
            }
        }
    }

    /// The named features this model hides that `actual` (the vCPU's
    /// CPUID read back from KVM) still shows.
    pub fn still_visible(&self, actual: &CpuId) -> Vec<&'static str> {
        FEATURES
            .iter()
            .filter(|f| self.hides(f) && f.is_set_in(actual))
            .map(|f| f.name)
            .collect()
    }
}

fn entry(cpuid: &CpuId, leaf: u32, subleaf: u32) -> Option<&kvm_cpuid_entry2> {
    cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == leaf && e.index == subleaf)
}

fn entry_mut(cpuid: &mut CpuId, leaf: u32, subleaf: u32) -> Option<&mut kvm_cpuid_entry2> {
    cpuid
        .as_mut_slice()
        .iter_mut()
        .find(|e| e.function == leaf && e.index == subleaf)
}

fn reg(e: &kvm_cpuid_entry2, r: Reg) -> &u32 {
    match r {
        Reg::Eax => &e.eax,
        Reg::Ebx => &e.ebx,
        Reg::Ecx => &e.ecx,
        Reg::Edx => &e.edx,
    }
}

fn reg_mut(e: &mut kvm_cpuid_entry2, r: Reg) -> &mut u32 {
    match r {
        Reg::Eax => &mut e.eax,
        Reg::Ebx => &mut e.ebx,
        Reg::Ecx => &mut e.ecx,
        Reg::Edx => &mut e.edx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table with every bit of the leaves we touch set, and a KVM leaf.
    fn everything() -> CpuId {
        let full = |function, index| kvm_cpuid_entry2 {
            function,
            index,
            eax: !0,
            ebx: !0,
            ecx: !0,
            edx: !0,
            ..Default::default()
        };
        CpuId::from_entries(&[
            full(1, 0),
            full(7, 0),
            full(7, 1),
            full(0xd, 0),
            full(0xd, 1),
            full(0x8000_0001, 0),
            full(0x4000_0001, 0),
        ])
        .unwrap()
    }

    #[test]
    fn host_model_changes_nothing() {
        let mut c = everything();
        CpuModel::default().apply(&mut c);
        assert_eq!(c, everything());
        assert!(CpuModel::default().still_visible(&c).is_empty());
    }

    #[test]
    fn x86_64_v1_keeps_the_baseline_only() {
        let model = CpuModel {
            base: BaseModel::X86_64V1,
            hidden: vec![],
        };
        let mut c = everything();
        model.apply(&mut c);
        let e = |leaf, sub| *entry(&c, leaf, sub).unwrap();
        assert_eq!(e(1, 0).ecx, V1_LEAF1_ECX);
        assert_eq!(e(1, 0).edx, V1_LEAF1_EDX);
        // SSE2 (26), FXSR (24), CMOV (15) stay; no ebx/eax change.
        assert_ne!(e(1, 0).edx & (1 << 26 | 1 << 24 | 1 << 15), 0);
        assert_eq!(e(1, 0).eax, !0);
        for (leaf, sub) in [(7, 0), (7, 1), (0xd, 0), (0xd, 1)] {
            let x = e(leaf, sub);
            assert_eq!(
                (x.eax, x.ebx, x.ecx, x.edx),
                (0, 0, 0, 0),
                "{leaf:#x}.{sub}"
            );
        }
        assert_eq!(e(0x8000_0001, 0).ecx, 0);
        assert_eq!(
            e(0x8000_0001, 0).edx & (1 << 29 | 1 << 20 | 1 << 11),
            1 << 29 | 1 << 20 | 1 << 11
        );
        assert_eq!(
            e(0x8000_0001, 0).edx & (1 << 26 | 1 << 27),
            0,
            "pdpe1gb, rdtscp"
        );
        // KVM's paravirtual leaves are untouched (kvm-clock).
        assert_eq!(e(0x4000_0001, 0).eax, !0);
        // Every named feature is hidden by the model except the platform ones.
        assert_eq!(model.still_visible(&c), Vec::<&str>::new());
        let visible: Vec<_> = FEATURES
            .iter()
            .filter(|f| f.is_set_in(&c))
            .map(|f| f.name)
            .collect();
        assert_eq!(&visible[..2], ["x2apic", "tsc_deadline_timer"]);
        assert!(
            visible[2..].iter().all(|n| n.starts_with("kvm_")),
            "{visible:?}"
        );
    }

    #[test]
    fn hidden_features_are_cleared_alone() {
        let model = CpuModel {
            base: BaseModel::Host,
            hidden: vec![
                Feature::by_name("cx16").unwrap(),
                Feature::by_name("xsaves").unwrap(),
            ],
        };
        let mut c = everything();
        model.apply(&mut c);
        assert_eq!(entry(&c, 1, 0).unwrap().ecx, !(1 << 13));
        assert_eq!(entry(&c, 0xd, 1).unwrap().eax, !(1 << 3));
        assert_eq!(entry(&c, 7, 0).unwrap().ebx, !0);
        assert!(Feature::by_name("no_such_feature").is_none());
    }

    #[test]
    fn features_a_host_puts_back_are_named() {
        let model = CpuModel {
            base: BaseModel::X86_64V1,
            hidden: vec![Feature::by_name("x2apic").unwrap()],
        };
        // What a vCPU reports when KVM ignored the model entirely.
        let visible = model.still_visible(&everything());
        assert!(visible.contains(&"xsave") && visible.contains(&"popcnt"));
        assert!(visible.contains(&"x2apic"), "hidden on top of the model");
        assert!(
            !visible.contains(&"tsc_deadline_timer"),
            "kept by the model"
        );
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in FEATURES.iter().enumerate() {
            assert!(
                FEATURES[i + 1..].iter().all(|b| b.name != a.name),
                "{}",
                a.name
            );
            assert!(FEATURES[i + 1..]
                .iter()
                .all(|b| (b.leaf, b.subleaf, b.reg, b.bit) != (a.leaf, a.subleaf, a.reg, a.bit)));
        }
    }
}
