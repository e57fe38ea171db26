/*
 * bootinfo.h - what the guest learns from the PVH start_info (see
 * bootinfo.c): options parsed from the command line.
 */
#ifndef GUEST_BOOTINFO_H
#define GUEST_BOOTINFO_H
#include "common.h"
#include "machine_end.h"

struct boot_options {
	/* disks=N on the command line: exact number of virtio-blk devices
	 * expected; -1 when absent (then at least one is required). */
	int expect_disks;
	/* event_idx=on|off: accept VIRTIO_F_RING_EVENT_IDX when offered
	 * (default on, as Linux does). */
	int event_idx;
	/* indirect=on|off: accept VIRTIO_F_INDIRECT_DESC when offered (default
	 * on); the position-pattern requests then use an indirect table. */
	int indirect;
	/* The API checks (api_checks.c): wait_resize, wait_hotplug,
	 * io_rounds=N (0: none), rounds_all (the rounds go to every disk,
	 * not only disk0), counts, wait_power_button, park. */
	int wait_resize;
	int wait_hotplug;
	int io_rounds;
	int rounds_all;
	int counts;
	int wait_power_button;
	int park;
	/* end=poweroff|acpi-reset|i8042|triple (machine_end.c). */
	enum end_mode end;
	/* Load mode (load.c): load=SECONDS (0: off), depth=N requests in
	 * flight per queue, bs=BYTES per request, rw=one of enum load_rw. */
	int load_seconds;
	int load_depth;
	u32 load_bs;
	int load_rw;
};

enum load_rw { LOAD_RANDREAD, LOAD_RANDWRITE, LOAD_READ, LOAD_WRITE };
/* Limits of the load options (the ring and the buffer bound them further,
 * checked in load.c). */
#define LOAD_MAX_SECONDS 3600
#define LOAD_MAX_DEPTH 128
#define LOAD_MAX_BS (1024u * 1024)

/* Validates start_info (fails the run when it is bad), prints the command
 * line and memory map, fills opt. */
void bootinfo_read(u64 start_info_paddr, struct boot_options *opt);

#endif
