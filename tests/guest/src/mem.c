/*
 * mem.c - memory helpers: the libc functions gcc may call, word-sized fill
 * and compare built on rep stosq / repe scasq (guest code is emulated here,
 * so big buffers are never touched byte by byte), and a bump allocator over
 * a fixed arena for the virtqueue rings.
 *
 * In: pointers into guest RAM owned by the caller. Out: filled memory,
 * mismatch positions, zeroed blocks (NULL once the arena is used up).
 */
#include "common.h"

#define ARENA_BYTES (1024 * 1024)

/* Not zeroed at boot (.noinit): zalloc zeroes what it hands out. */
static u8 arena[ARENA_BYTES] __attribute__((aligned(4096), section(".noinit")));
static usize arena_used;

void *memset(void *d, int c, usize n)
{
	void *ret = d;
	__asm__ __volatile__("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
	return ret;
}

void *memcpy(void *d, const void *s, usize n)
{
	void *ret = d;
	__asm__ __volatile__("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
	return ret;
}

int memcmp(const void *a, const void *b, usize n)
{
	const u8 *x = a, *y = b;
	for (usize i = 0; i < n; i++) {
		if (x[i] != y[i])
			return x[i] < y[i] ? -1 : 1;
	}
	return 0;
}

usize strlen(const char *s)
{
	usize n = 0;
	while (s[n])
		n++;
	return n;
}

void fill64(void *d, u64 word, usize n)
{
	usize count = n / 8;
	__asm__ __volatile__("rep stosq" : "+D"(d), "+c"(count) : "a"(word) : "memory");
}

i64 find_mismatch64(const void *d, u64 word, usize n)
{
	usize count = n / 8;
	const void *p = d;
	u8 differs;
	if (count == 0)
		return -1;
	__asm__ __volatile__("repe scasq\n\tsetne %2"
			     : "+D"(p), "+c"(count), "=qm"(differs)
			     : "a"(word)
			     : "memory", "cc");
	if (!differs)
		return -1;
	/* %rdi stopped one word past the mismatch. */
	return (i64)(((const u8 *)p - (const u8 *)d) / 8) - 1;
}

void *zalloc(usize bytes, usize align)
{
	usize start = ALIGN_UP(arena_used, align);
	if (start > ARENA_BYTES || bytes > ARENA_BYTES - start)
		return NULL;
	void *p = &arena[start];
	arena_used = start + bytes;
	memset(p, 0, bytes);
	return p;
}
