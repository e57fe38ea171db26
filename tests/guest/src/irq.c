/*
 * irq.c - interrupts: the IDT, the local APIC (xAPIC MMIO), a periodic
 * LAPIC timer used only as a wake-up source for timeouts, per-vector
 * interrupt counters, and MSI vector allocation.
 *
 * In:  interrupts delivered by the VMM (MSI-X messages from the devices,
 *      the LAPIC timer) via the stubs in entry.S.
 * Out: irq_count[] / irq_ticks, read by the virtqueue wait loop. A CPU
 *      exception ends the run with RESULT: FAIL.
 */
#include "irq.h"

#define MSR_APIC_BASE 0x1B
#define APIC_BASE_ENABLE (1u << 11)
#define LAPIC_ID 0x20
#define LAPIC_TPR 0x80
#define LAPIC_EOI 0xB0
#define LAPIC_SVR 0xF0
#define LAPIC_LVT_TIMER 0x320
#define LAPIC_LVT_LINT0 0x350
#define LAPIC_LVT_LINT1 0x360
#define LAPIC_LVT_ERROR 0x370
#define LAPIC_TIMER_INIT 0x380
#define LAPIC_TIMER_DIV 0x3E0
#define LVT_MASKED (1u << 16)
#define LVT_PERIODIC (1u << 17)

#define VEC_TIMER 0x20
#define VEC_ERROR 0x21
#define VEC_FIRST_MSI 0x30
#define VEC_LAST_MSI 0xEF
#define VEC_SPURIOUS 0xFF
/* Divide by 16 from the 1 GHz APIC bus KVM and QEMU emulate: 10 ms. */
#define TIMER_DIV_16 0x3
#define TIMER_COUNT 625000
/* Iterations of a read loop we allow before declaring the timer dead. */
#define TIMER_PROBE_SPINS 3000000

struct isr_frame {
	u64 r11, r10, r9, r8, rdi, rsi, rdx, rcx, rax;
	u64 vector, error;
	u64 rip, cs, rflags, rsp, ss;
};

struct idt_entry {
	u16 offset_lo;
	u16 selector;
	u8 ist;
	u8 type_attr;
	u16 offset_mid;
	u32 offset_hi;
	u32 zero;
} __attribute__((packed));

struct idt_desc {
	u16 limit;
	u64 base;
} __attribute__((packed));

extern char isr_stubs[];

static struct idt_entry idt[256] __attribute__((aligned(16)));
static u64 lapic_base;
static u32 next_vector = VEC_FIRST_MSI;

volatile u32 irq_count[256];
volatile u64 irq_ticks;
volatile u32 irq_unexpected;
u32 irq_apic_id;

static u64 rdmsr(u32 msr)
{
	u32 lo, hi;
	__asm__ __volatile__("rdmsr" : "=a"(lo), "=d"(hi) : "c"(msr));
	return ((u64)hi << 32) | lo;
}

static void wrmsr(u32 msr, u64 v)
{
	__asm__ __volatile__("wrmsr" ::"c"(msr), "a"((u32)v), "d"((u32)(v >> 32)));
}

static u32 lapic_read(u32 reg) { return mmio_read32(lapic_base + reg); }
static void lapic_write(u32 reg, u32 v) { mmio_write32(lapic_base + reg, v); }

static const char *const exception_names[32] = {
	"#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM", "#DF", "CSO", "#TS",
	"#NP", "#SS", "#GP", "#PF", "15",  "#MF", "#AC", "#MC", "#XM", "#VE", "#CP",
};

void isr_dispatch(struct isr_frame *f)
{
	u64 v = f->vector;
	if (v < 32) {
		u64 cr2;
		__asm__ __volatile__("mov %%cr2, %0" : "=r"(cr2));
		fail("CPU exception %lu (%s) error 0x%lx at rip 0x%lx cr2 0x%lx", v,
		     exception_names[v] ? exception_names[v] : "?", f->error, f->rip, cr2);
	}
	if (v == VEC_SPURIOUS)
		return; /* spurious: no EOI */
	if (v == VEC_TIMER)
		irq_ticks++;
	else if (v != VEC_ERROR && (v < VEC_FIRST_MSI || v >= next_vector) && !irq_unexpected)
		irq_unexpected = (u32)v; /* nobody was given this vector */
	irq_count[v & 0xFF]++;
	lapic_write(LAPIC_EOI, 0);
}

static void idt_init(void)
{
	for (int v = 0; v < 256; v++) {
		u64 a = (u64)isr_stubs + (u64)v * 16;
		idt[v].offset_lo = (u16)a;
		idt[v].selector = 0x18;
		idt[v].ist = 0;
		idt[v].type_attr = 0x8E; /* present, DPL 0, 64-bit interrupt gate */
		idt[v].offset_mid = (u16)(a >> 16);
		idt[v].offset_hi = (u32)(a >> 32);
		idt[v].zero = 0;
	}
	struct idt_desc d = {.limit = sizeof(idt) - 1, .base = (u64)idt};
	__asm__ __volatile__("lidt %0" ::"m"(d));
}

/* Masks both 8259s so legacy timer/ISA interrupts (e.g. from firmware that
 * ran before us) cannot arrive on exception vectors. */
static void pic_mask_all(void)
{
	outb(0x21, 0xFF);
	outb(0xA1, 0xFF);
}

void irq_init(void)
{
	pic_mask_all();
	idt_init();

	u64 base = rdmsr(MSR_APIC_BASE);
	lapic_base = base & 0x000FFFFFFFFFF000UL;
	if (lapic_base >= 0x100000000UL)
		fail("LAPIC base 0x%lx is above 4 GiB", lapic_base);
	if (!(base & APIC_BASE_ENABLE))
		wrmsr(MSR_APIC_BASE, base | APIC_BASE_ENABLE);
	irq_apic_id = lapic_read(LAPIC_ID) >> 24;

	lapic_write(LAPIC_TPR, 0);
	lapic_write(LAPIC_SVR, 0x100 | VEC_SPURIOUS);
	lapic_write(LAPIC_LVT_LINT0, LVT_MASKED);
	lapic_write(LAPIC_LVT_LINT1, LVT_MASKED);
	lapic_write(LAPIC_LVT_ERROR, VEC_ERROR);
	lapic_write(LAPIC_TIMER_DIV, TIMER_DIV_16);
	lapic_write(LAPIC_LVT_TIMER, LVT_PERIODIC | VEC_TIMER);
	lapic_write(LAPIC_TIMER_INIT, TIMER_COUNT);
	kprintf("ok   LAPIC at 0x%lx enabled, APIC id %u\n", lapic_base, irq_apic_id);

	sti();
	for (u32 i = 0; i < TIMER_PROBE_SPINS && irq_ticks == 0; i++)
		__asm__ __volatile__("pause");
	if (irq_ticks == 0)
		fail("LAPIC timer interrupt never arrived (needed for timeouts)");
	kprintf("ok   LAPIC timer ticking (vector 0x%x)\n", VEC_TIMER);
}

u32 irq_alloc_vector(void)
{
	if (next_vector > VEC_LAST_MSI)
		fail("out of interrupt vectors");
	return next_vector++;
}
