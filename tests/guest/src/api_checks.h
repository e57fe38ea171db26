/*
 * api_checks.h - the checks that wait for the VMM's API (see api_checks.c).
 */
#ifndef GUEST_API_CHECKS_H
#define GUEST_API_CHECKS_H
#include "bootinfo.h"
#include "virtio.h"

/* Runs the checks the options ask for, on disks[0] and any disk hot-added
 * (appended to disks[], *nd grows); max is the room in disks[]. */
void api_checks_run(const struct boot_options *opt, struct vdev *disks, int *nd, int max);

#endif
