/*
 * clock.h - a nanosecond clock from KVM's paravirtual clock (see clock.c).
 */
#ifndef GUEST_CLOCK_H
#define GUEST_CLOCK_H
#include "common.h"

/* Registers kvm-clock when the hypervisor offers it; returns 1 when the
 * clock can be read, 0 when not (then callers count LAPIC ticks). */
int clock_init(void);
/* Nanoseconds of kvm-clock (only after clock_init returned 1). */
u64 clock_ns(void);

#endif
