/*
 * clock.c - kvm-clock: KVM's paravirtual clock, for the load mode's elapsed
 * time. The guest gives KVM the address of a time record (MSR
 * MSR_KVM_SYSTEM_TIME_NEW); KVM keeps in it the host's time at a TSC
 * reading and the TSC-to-nanoseconds scale, so the time is read with one
 * rdtsc and no exit, and it follows the host's clock even while the vCPU
 * thread waits for a CPU (when the LAPIC timer's ticks get lost: irq.c).
 * Offered when CPUID leaf 0x40000000 says "KVMKVMKVM" and leaf 0x40000001
 * has KVM_FEATURE_CLOCKSOURCE2 (the VMM passes KVM's CPUID on).
 *
 * In:  CPUID, the time record KVM writes. Out: nanoseconds.
 */
#include "clock.h"

#define KVM_CPUID_SIGNATURE 0x40000000u
#define KVM_CPUID_FEATURES 0x40000001u
#define KVM_FEATURE_CLOCKSOURCE2 3
#define MSR_KVM_SYSTEM_TIME_NEW 0x4b564d01u
/* "KVMKVMKVM\0\0\0" in ebx, ecx, edx. */
#define KVM_SIG_EBX 0x4b4d564bu
#define KVM_SIG_ECX 0x564b4d56u
#define KVM_SIG_EDX 0x0000004du

/* The layout KVM writes (struct pvclock_vcpu_time_info). */
struct pvclock_time {
	u32 version; /* odd while KVM updates the record */
	u32 pad0;
	u64 tsc_timestamp;
	u64 system_time;
	u32 tsc_to_system_mul;
	signed char tsc_shift;
	u8 flags;
	u8 pad[2];
} __attribute__((packed));

static volatile struct pvclock_time pvclock __attribute__((aligned(64)));

static void cpuid(u32 leaf, u32 *a, u32 *b, u32 *c, u32 *d)
{
	__asm__ __volatile__("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(0));
}

static u64 rdtsc_ordered(void)
{
	u32 lo, hi;
	__asm__ __volatile__("lfence; rdtsc" : "=a"(lo), "=d"(hi)::"memory");
	return ((u64)hi << 32) | lo;
}

int clock_init(void)
{
	u32 a, b, c, d;
	cpuid(KVM_CPUID_SIGNATURE, &a, &b, &c, &d);
	if (b != KVM_SIG_EBX || c != KVM_SIG_ECX || d != KVM_SIG_EDX)
		return 0;
	/* eax: the highest KVM leaf (0 on old KVM means 0x40000001). */
	if (a != 0 && a < KVM_CPUID_FEATURES)
		return 0;
	cpuid(KVM_CPUID_FEATURES, &a, &b, &c, &d);
	if (!((a >> KVM_FEATURE_CLOCKSOURCE2) & 1))
		return 0;
	u64 addr = (u64)&pvclock | 1; /* bit 0: enable */
	__asm__ __volatile__("wrmsr" ::"c"(MSR_KVM_SYSTEM_TIME_NEW), "a"((u32)addr),
			     "d"((u32)(addr >> 32))
			     : "memory");
	/* KVM fills the record before the vCPU runs again. */
	return pvclock.version != 0 && (pvclock.version & 1) == 0 && pvclock.tsc_to_system_mul != 0;
}

u64 clock_ns(void)
{
	u32 v;
	u64 ns;
	do {
		v = pvclock.version;
		barrier();
		u64 delta = rdtsc_ordered() - pvclock.tsc_timestamp;
		int shift = pvclock.tsc_shift;
		delta = shift < 0 ? delta >> -shift : delta << shift;
		ns = pvclock.system_time +
		     (u64)(((unsigned __int128)delta * pvclock.tsc_to_system_mul) >> 32);
		barrier();
	} while ((v & 1) || v != pvclock.version);
	return ns;
}
