/*
 * paging.c - adds 2 MiB identity mappings above 4 GiB to the page tables
 * entry.S built, for 64-bit BARs a VMM placed high.
 *
 * In:  a physical range (from a BAR). Out: page-table entries taken from a
 *      small fixed pool (no unbounded allocation); CR3 reloaded.
 */
#include "paging.h"

#define PTE_PRESENT 0x1UL
#define PTE_WRITE 0x2UL
#define PTE_PWT 0x8UL
#define PTE_PCD 0x10UL
#define PTE_PS 0x80UL
#define PTE_ADDR_MASK 0x000FFFFFFFFFF000UL
#define PAGE_2M (2UL << 20)
#define POOL_PAGES 8
/* Never map more than this per call (a BAR of a virtio device is small). */
#define MAX_MAP_BYTES (1UL << 30)

extern u64 pml4[512];

static u64 pool[POOL_PAGES][512] __attribute__((aligned(4096)));
static int pool_used;

static u32 phys_addr_bits(void)
{
	u32 a, b, c, d;
	__asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u));
	if (a < 0x80000008u)
		return 36;
	__asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000008u));
	return a & 0xFF;
}

/* The table an entry points to, allocated from the pool when absent. */
static u64 *next_table(u64 *entry)
{
	if (*entry & PTE_PRESENT) {
		if (*entry & PTE_PS)
			return NULL; /* already a large page: no table below */
		return (u64 *)(*entry & PTE_ADDR_MASK);
	}
	if (pool_used == POOL_PAGES)
		return NULL;
	u64 *t = pool[pool_used++];
	*entry = (u64)t | PTE_PRESENT | PTE_WRITE;
	return t;
}

int paging_map_mmio(u64 addr, u64 size)
{
	if (size == 0 || size > MAX_MAP_BYTES || addr + size < addr)
		return 0;
	u64 end = addr + size;
	if (end <= 0x100000000UL)
		return 1;
	if (end > (1UL << phys_addr_bits()) || end > (1UL << 47))
		return 0;
	for (u64 a = addr & ~(PAGE_2M - 1); a < end; a += PAGE_2M) {
		if (a < 0x100000000UL)
			continue;
		u64 *pdpt = next_table(&pml4[(a >> 39) & 511]);
		if (!pdpt)
			return 0;
		u64 *pd = next_table(&pdpt[(a >> 30) & 511]);
		if (!pd)
			return 0;
		pd[(a >> 21) & 511] = a | PTE_PRESENT | PTE_WRITE | PTE_PS | PTE_PCD | PTE_PWT;
	}
	u64 cr3;
	__asm__ __volatile__("mov %%cr3, %0; mov %0, %%cr3" : "=r"(cr3)::"memory");
	return 1;
}
