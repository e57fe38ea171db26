/*
 * common.h - basic types, port/MMIO accessors and the shared helpers every
 * part of the test guest uses (console output, failure, memory helpers).
 *
 * Data enters and leaves the guest only through the helpers declared here:
 * I/O ports (inb/outb...), MMIO (mmio_read32...) and the serial console.
 */
#ifndef GUEST_COMMON_H
#define GUEST_COMMON_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
typedef long i64;
typedef unsigned long usize;

#define NULL ((void *)0)
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define ALIGN_UP(x, a) (((x) + (a) - 1) & ~((u64)(a) - 1))

/* Compiler barrier: x86 is TSO, so ordering stores to the rings against
 * each other only needs the compiler not to reorder them. */
#define barrier() __asm__ __volatile__("" ::: "memory")
/* Full barrier, used before reading what the device wrote after our stores. */
#define mb() __asm__ __volatile__("mfence" ::: "memory")

static inline void outb(u16 port, u8 v) { __asm__ __volatile__("outb %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outw(u16 port, u16 v) { __asm__ __volatile__("outw %0, %1" ::"a"(v), "Nd"(port)); }
static inline void outl(u16 port, u32 v) { __asm__ __volatile__("outl %0, %1" ::"a"(v), "Nd"(port)); }
static inline u8 inb(u16 port)
{
	u8 v;
	__asm__ __volatile__("inb %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}
static inline u16 inw(u16 port)
{
	u16 v;
	__asm__ __volatile__("inw %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}
static inline u32 inl(u16 port)
{
	u32 v;
	__asm__ __volatile__("inl %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}

static inline u8 mmio_read8(u64 a) { return *(volatile u8 *)a; }
static inline u16 mmio_read16(u64 a) { return *(volatile u16 *)a; }
static inline u32 mmio_read32(u64 a) { return *(volatile u32 *)a; }
static inline void mmio_write8(u64 a, u8 v) { *(volatile u8 *)a = v; }
static inline void mmio_write16(u64 a, u16 v) { *(volatile u16 *)a = v; }
static inline void mmio_write32(u64 a, u32 v) { *(volatile u32 *)a = v; }
/* 64-bit registers of virtio common config are written as two 32-bit halves
 * (low first), which every transport must accept. */
static inline void mmio_write64(u64 a, u64 v)
{
	mmio_write32(a, (u32)v);
	mmio_write32(a + 4, (u32)(v >> 32));
}

static inline void cli(void) { __asm__ __volatile__("cli" ::: "memory"); }
/* sti;hlt is atomic with respect to interrupts (sti shadow), so a wake-up
 * interrupt cannot slip in between the check and the halt. */
static inline void sti_hlt(void) { __asm__ __volatile__("sti; hlt" ::: "memory"); }
static inline void sti(void) { __asm__ __volatile__("sti" ::: "memory"); }

/* console.c */
void console_init(void);
void kprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void pass(void) __attribute__((noreturn));

/* entry.S */
void machine_reset(void) __attribute__((noreturn));

/* mem.c */
void *memset(void *d, int c, usize n);
void *memcpy(void *d, const void *s, usize n);
int memcmp(const void *a, const void *b, usize n);
usize strlen(const char *s);
/* Fill n bytes (multiple of 8) with a repeated 64-bit word. */
void fill64(void *d, u64 word, usize n);
/* Index of the first 64-bit word (n multiple of 8) that differs from word,
 * or -1 when all match. */
i64 find_mismatch64(const void *d, u64 word, usize n);
/* Zeroed memory (align: power of two) from a fixed arena that is never
 * freed; NULL when exhausted. */
void *zalloc(usize bytes, usize align);

#endif
