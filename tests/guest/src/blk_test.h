/*
 * blk_test.h - the per-disk virtio-blk checks (see blk_test.c).
 */
#ifndef GUEST_BLK_TEST_H
#define GUEST_BLK_TEST_H
#include "virtio.h"

/* Runs every check on every queue of an initialised disk; fails the run on
 * the first failed check. */
void blk_test_disk(struct vdev *d);

#endif
