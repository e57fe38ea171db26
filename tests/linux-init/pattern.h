/*
 * The data the guest writes: the 64-bit little-endian word at disk offset
 * OFF (a multiple of 8) of a region written with SEED is
 *     OFF * 0x9e3779b97f4a7c15 + SEED   (mod 2^64)
 * so every sector of the disk holds different bytes and a misplaced or
 * stale sector shows. scripts/run-linux-guest.sh builds the image the
 * host expects with the same formula.
 */
#ifndef LINUX_INIT_PATTERN_H
#define LINUX_INIT_PATTERN_H

#include "sys.h"

static inline u64 pattern_word(u64 seed, u64 off)
{
	return off * 0x9e3779b97f4a7c15UL + seed;
}

static inline void pattern_fill(u8 *buf, size_t len, u64 seed, u64 off)
{
	u64 *w = (u64 *)buf;
	for (size_t i = 0; i < len / 8; i++)
		w[i] = pattern_word(seed, off + i * 8);
}

/* The number of 8-byte words that differ from the pattern. */
static inline u64 pattern_mismatches(const u8 *buf, size_t len, u64 seed, u64 off)
{
	const u64 *w = (const u64 *)buf;
	u64 bad = 0;
	for (size_t i = 0; i < len / 8; i++)
		bad += w[i] != pattern_word(seed, off + i * 8);
	return bad;
}

static inline u64 zero_mismatches(const u8 *buf, size_t len)
{
	const u64 *w = (const u64 *)buf;
	u64 bad = 0;
	for (size_t i = 0; i < len / 8; i++)
		bad += w[i] != 0;
	return bad;
}

#endif
