/*
 * api_checks.c - checks that wait for something the host does through the
 * VMM's API while the guest runs, each bounded by a timeout in LAPIC ticks
 * and polling slowly (the guest runs under an instruction emulator):
 *
 *   io_rounds=N   N rounds on disk0: round r writes 4 KiB of bytes
 *                 0x20 + r % 0xC0 at 8 MiB + r * 4 KiB, reads it back and
 *                 checks it; every 8th round flushes; about 30 ms between
 *                 rounds; at the end every round is read back again. The
 *                 host pauses, resumes or snapshots the disk meanwhile.
 *                 With rounds_all, each round goes to every disk in turn
 *                 (disk k's bytes: 0x20 + (r + 0x31 * k) % 0xC0).
 *   wait_resize   prints "WAIT resize", polls disk0's capacity until it
 *                 changes, then writes and reads back the last 4 KiB
 *                 before the new end and expects IOERR at the new end.
 *   wait_hotplug  prints "WAIT hotplug", polls the PCI hotplug register
 *                 PCIU (what the DSDT's PCNT reads) for a new slot, probes
 *                 it, runs every block check on the new disk; then prints
 *                 "WAIT unplug", polls PCID for that slot, resets the
 *                 device, writes the slot's bit to B0EJ (as the slot's
 *                 _EJ0 does) and waits until the slot reads empty.
 *   load=SECONDS  the load mode (load.c) on every disk found at boot; its
 *                 requests are counted in the COUNT lines.
 *   counts        prints one COUNT line per disk with what the guest asked
 *                 of it (blk_counts), for comparison with vm.counters.
 *   wait_power_button  prints "WAIT power-button", polls the Generic
 *                 Event Device's event register (what the DSDT's GED _EVT
 *                 reads before it notifies \_SB.PWRB) until its power
 *                 button bit is set; the run then ends as an OS would
 *                 after the button: powered off (or as end= says).
 *
 * In:  initialised disks. Out: console lines; the first failure ends the
 *      run with RESULT: FAIL.
 */
#include "api_checks.h"
#include "blk_test.h"
#include "irq.h"
#include "load.h"

#define SECTOR 512u
#define ROUND_BASE (8UL << 20)
#define ROUND_LEN 4096u
#define WAIT_TIMEOUT_TICKS (60 * IRQ_TICKS_PER_SECOND)
#define EJECT_TIMEOUT_TICKS (10 * IRQ_TICKS_PER_SECOND)
#define HOTPLUG_PORT 0x610
#define PCIU (HOTPLUG_PORT + 0)
#define PCID (HOTPLUG_PORT + 4)
#define B0EJ (HOTPLUG_PORT + 8)
#define GED_EVENTS 0x620
#define GED_POWER_BUTTON 1u
#define S_OK 0
#define S_IOERR 1

static u8 buf[ROUND_LEN] __attribute__((aligned(4096)));

/* Sleeps about `ticks` LAPIC ticks. */
static void sleep_ticks(u64 ticks)
{
	u64 start = irq_ticks;
	while (irq_ticks - start < ticks)
		sti_hlt();
}

static u8 round_byte(int k, int r) { return (u8)(0x20 + (r + 0x31 * k) % 0xC0); }

static void check_fill(struct vdev *d, u64 off, u8 want, const char *what)
{
	for (u32 i = 0; i < ROUND_LEN; i++) {
		if (buf[i] != want)
			fail("disk%d: %s at 0x%lx: byte %u reads 0x%x, want 0x%x", d->index, what, off,
			     i, buf[i], want);
	}
}

/* Round r on disk d: write, read back, check; every 8th round flushes. */
static void one_round(struct vdev *d, int r)
{
	u64 off = ROUND_BASE + (u64)r * ROUND_LEN;
	u8 want = round_byte(d->index, r);
	memset(buf, want, ROUND_LEN);
	u8 s = blk_rw(d, 0, 1, off, buf, ROUND_LEN);
	if (s != S_OK)
		fail("disk%d: round %d write gave status %u", d->index, r, s);
	memset(buf, 0xA5, ROUND_LEN);
	s = blk_rw(d, 0, 0, off, buf, ROUND_LEN);
	if (s != S_OK)
		fail("disk%d: round %d read gave status %u", d->index, r, s);
	check_fill(d, off, want, "round read-back");
	if (r % 8 == 7 && blk_flush(d, 0) != S_OK)
		fail("disk%d: round %d flush failed", d->index, r);
}

/* The rounds on disks[0..nd). */
static void io_rounds(struct vdev *disks, int nd, int n)
{
	u64 end = ROUND_BASE + (u64)n * ROUND_LEN;
	for (int k = 0; k < nd; k++) {
		if (end > disks[k].cfg.capacity * SECTOR)
			fail("disk%d: io_rounds=%d needs %lu bytes, the disk has %lu", disks[k].index,
			     n, end, disks[k].cfg.capacity * SECTOR);
	}
	for (int r = 0; r < n; r++) {
		for (int k = 0; k < nd; k++)
			one_round(&disks[k], r);
		kprintf("ok   round %d\n", r);
		sleep_ticks(3);
	}
	for (int k = 0; k < nd; k++) {
		struct vdev *d = &disks[k];
		for (int r = 0; r < n; r++) {
			u64 off = ROUND_BASE + (u64)r * ROUND_LEN;
			memset(buf, 0xA5, ROUND_LEN);
			if (blk_rw(d, 0, 0, off, buf, ROUND_LEN) != S_OK)
				fail("disk%d: re-reading round %d failed", d->index, r);
			check_fill(d, off, round_byte(d->index, r), "round re-read");
		}
	}
	if (nd > 1)
		kprintf("ok   all %d rounds read back on %d disks\n", n, nd);
	else
		kprintf("ok   all %d rounds read back\n", n);
}

static void wait_resize(struct vdev *d)
{
	u64 old = d->cfg.capacity;
	u8 gen = vdev_config_generation(d);
	u32 irqs = irq_count[d->config_cpu_vector];
	kprintf("WAIT resize capacity=%lu\n", old);
	u64 start = irq_ticks;
	for (;;) {
		vdev_read_config(d);
		if (d->cfg.capacity != old)
			break;
		if (irq_ticks - start > WAIT_TIMEOUT_TICKS)
			fail("disk%d: capacity still %lu sectors after 60 s", d->index, old);
		sleep_ticks(5);
	}
	u64 cap = d->cfg.capacity;
	kprintf("ok   disk%d capacity %lu -> %lu sectors, config generation %u -> %u, %u config "
		"interrupt(s)\n",
		d->index, old, cap, gen, vdev_config_generation(d),
		irq_count[d->config_cpu_vector] - irqs);
	if (cap < ROUND_LEN / SECTOR)
		fail("disk%d: new capacity %lu is too small to check", d->index, cap);
	u64 off = cap * SECTOR - ROUND_LEN;
	memset(buf, 0x5A, ROUND_LEN);
	u8 s = blk_rw(d, 0, 1, off, buf, ROUND_LEN);
	if (s != S_OK)
		fail("disk%d: write of the last 4 KiB at 0x%lx gave status %u", d->index, off, s);
	memset(buf, 0xA5, ROUND_LEN);
	s = blk_rw(d, 0, 0, off, buf, ROUND_LEN);
	if (s != S_OK)
		fail("disk%d: read of the last 4 KiB at 0x%lx gave status %u", d->index, off, s);
	check_fill(d, off, 0x5A, "new end");
	s = blk_rw(d, 0, 0, cap * SECTOR, buf, SECTOR);
	if (s != S_IOERR)
		fail("disk%d: read at the new capacity gave status %u, want IOERR", d->index, s);
	kprintf("ok   disk%d wrote and read back the last 4 KiB at 0x%lx; reading at the new end "
		"fails\n",
		d->index, off);
}

/* Polls a read-to-clear hotplug register until it has a bit; returns the
 * lowest slot set. */
static int wait_slot_bit(u16 port, const char *what)
{
	u64 start = irq_ticks;
	for (;;) {
		u32 bits = inl(port) & ~1u;
		if (bits) {
			for (int s = 1; s < 32; s++)
				if (bits & (1u << s))
					return s;
		}
		if (irq_ticks - start > WAIT_TIMEOUT_TICKS)
			fail("no %s announced within 60 s", what);
		sleep_ticks(5);
	}
}

static int is_blk(const struct pci_func *f)
{
	return f->vendor == VIRTIO_VENDOR &&
	       (f->device == VIRTIO_DEV_BLK_MODERN || f->device == VIRTIO_DEV_BLK_TRANSITIONAL);
}

static void wait_hotplug(const struct boot_options *opt, struct vdev *disks, int *nd, int max)
{
	if (*nd >= max)
		fail("no room for a hot-added disk");
	kprintf("WAIT hotplug\n");
	int slot = wait_slot_bit(PCIU, "hot-added slot");
	struct vdev *d = &disks[*nd];
	memset(d, 0, sizeof(*d));
	if (!pci_probe_slot((u8)slot, &d->pci) || !is_blk(&d->pci))
		fail("slot %d was announced but holds no virtio-blk function", slot);
	d->index = *nd;
	d->allow_event_idx = opt->event_idx;
	d->allow_indirect = opt->indirect;
	(*nd)++;
	kprintf("ok   slot %d announced: %04x:%04x, disk%d\n", slot, d->pci.vendor, d->pci.device,
		d->index);
	pci_enable(&d->pci);
	vdev_init(d);
	blk_test_disk(d);
	kprintf("ok   hot-added disk%d passed the block checks\n", d->index);

	kprintf("WAIT unplug\n");
	int gone = wait_slot_bit(PCID, "slot to remove");
	if (gone != slot)
		fail("removal asked for slot %d, the hot-added disk is in slot %d", gone, slot);
	vdev_reset(d);
	outl(B0EJ, 1u << slot);
	u64 start = irq_ticks;
	struct pci_func probe;
	while (pci_probe_slot((u8)slot, &probe)) {
		if (irq_ticks - start > EJECT_TIMEOUT_TICKS)
			fail("slot %d still holds %04x:%04x 10 s after its eject", slot, probe.vendor,
			     probe.device);
		sleep_ticks(2);
	}
	kprintf("ok   slot %d ejected and empty\n", slot);
}

static void wait_power_button(void)
{
	kprintf("WAIT power-button\n");
	u64 start = irq_ticks;
	for (;;) {
		u32 v = inl(GED_EVENTS);
		if (v != 0xffffffffu && (v & GED_POWER_BUTTON))
			break;
		if (irq_ticks - start > WAIT_TIMEOUT_TICKS)
			fail("the power button was not pressed within 60 s");
		sleep_ticks(5);
	}
	kprintf("ok   power button pressed (GED event register bit 0)\n");
}

void api_checks_run(const struct boot_options *opt, struct vdev *disks, int *nd, int max)
{
	if (opt->wait_resize)
		wait_resize(&disks[0]);
	if (opt->io_rounds)
		io_rounds(disks, opt->rounds_all ? *nd : 1, opt->io_rounds);
	if (opt->load_seconds)
		load_run(opt, disks, *nd);
	if (opt->wait_hotplug)
		wait_hotplug(opt, disks, nd, max);
	if (opt->counts) {
		for (int i = 0; i < *nd && i < BLK_COUNT_DISKS; i++) {
			const struct blk_counts *c = &blk_counts[i];
			kprintf("COUNT disk%d read_ops=%lu read_bytes=%lu write_ops=%lu write_bytes=%lu "
				"flushes=%lu discards=%lu errors=%lu\n",
				i, c->reads, c->read_bytes, c->writes, c->write_bytes, c->flushes,
				c->discards, c->errors);
		}
	}
	if (opt->wait_power_button)
		wait_power_button();
}
