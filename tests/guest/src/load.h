/*
 * load.h - the load mode (see load.c): every queue of every disk kept busy
 * at a set depth for a set time, for benchmarks of the VMM's device path.
 */
#ifndef GUEST_LOAD_H
#define GUEST_LOAD_H
#include "bootinfo.h"
#include "virtio.h"

/* Runs the load the options describe on disks[0, nd) and prints the LOAD
 * lines; fails the run on a failed request, a stalled queue or options the
 * disks cannot take. */
void load_run(const struct boot_options *opt, struct vdev *disks, int nd);

#endif
