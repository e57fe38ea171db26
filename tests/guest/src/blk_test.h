/*
 * blk_test.h - the per-disk virtio-blk checks (see blk_test.c).
 */
#ifndef GUEST_BLK_TEST_H
#define GUEST_BLK_TEST_H
#include "virtio.h"

/* Runs every check on every queue of an initialised disk; fails the run on
 * the first failed check. */
void blk_test_disk(struct vdev *d);

/* What the guest asked of each disk (by disk index), counted the way the
 * VMM's vm.counters counts: reads, writes (with their data bytes),
 * flushes and discards/write-zeroes that succeeded; errors = requests
 * answered with any other status. */
struct blk_counts {
	u64 reads, read_bytes, writes, write_bytes, flushes, discards, errors;
};
#define BLK_COUNT_DISKS 8
extern struct blk_counts blk_counts[BLK_COUNT_DISKS];

/* One read or write of len bytes (one buffer) at byte offset off on queue
 * q; returns the status. */
u8 blk_rw(struct vdev *d, int q, int write, u64 off, u8 *buf, u32 len);
/* A flush on queue q; returns the status. */
u8 blk_flush(struct vdev *d, int q);

#endif
