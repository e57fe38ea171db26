/*
 * paging.h - extends the boot identity map for MMIO above 4 GiB (paging.c).
 */
#ifndef GUEST_PAGING_H
#define GUEST_PAGING_H
#include "common.h"

/* Makes [addr, addr + size) reachable (identity-mapped, uncached). The
 * first 4 GiB are always mapped. Returns 0 when the range is beyond the
 * CPU's physical address width or the page-table pool is used up. */
int paging_map_mmio(u64 addr, u64 size);

#endif
