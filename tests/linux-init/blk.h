#ifndef LINUX_INIT_BLK_H
#define LINUX_INIT_BLK_H

#include "sys.h"

/* The largest single request, and the size of each I/O buffer. */
#define IO_BUF 65536

/* A region of the disk written with one pattern seed. */
struct region {
	u64 off;
	u64 len;
	u64 seed;
};

/* What a write or check of a region found. */
struct io_result {
	i64 err;	   /* 0 or the first -errno */
	u64 mismatches;	   /* words that read back wrong */
	u64 requests;	   /* requests issued */
};

/*
 * Writes the region's pattern with O_DIRECT requests whose sizes cycle
 * through 4 KiB, 512 B, 64 KiB and 12 KiB (each at most IO_BUF), from
 * `buf` (aligned to 4 KiB, IO_BUF bytes).
 */
struct io_result region_write(int fd, const struct region *r, u8 *buf);
/* Reads the region back in 64 KiB requests; with seed 0 it must be zeroes. */
struct io_result region_check(int fd, const struct region *r, u8 *buf);

#endif
