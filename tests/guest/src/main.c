/*
 * main.c - the test guest's sequence: console, PVH start_info, interrupts,
 * PCI scan, virtio-blk initialisation, the block checks, RESULT line.
 *
 * In:  the start_info address from entry.S. Out: the serial report ending
 *      in exactly "RESULT: PASS" or "RESULT: FAIL <what>", then the end the
 *      command line asks for (machine_end.c: power-off by default).
 */
#include "api_checks.h"
#include "blk_test.h"
#include "bootinfo.h"
#include "irq.h"
#include "virtio.h"

#define MAX_FUNCS 64
#define MAX_DISKS 8

static struct pci_func funcs[MAX_FUNCS];
static struct vdev disks[MAX_DISKS];

void guest_main(u64 start_info);

static int is_virtio_blk(const struct pci_func *f)
{
	return f->vendor == VIRTIO_VENDOR &&
	       (f->device == VIRTIO_DEV_BLK_MODERN || f->device == VIRTIO_DEV_BLK_TRANSITIONAL);
}

void guest_main(u64 start_info)
{
	console_init();
	kprintf("\nvirtio-blk test guest (PVH entry, 64-bit)\n");
	struct boot_options opt;
	bootinfo_read(start_info, &opt);
	irq_init();

	int nf = pci_scan_bus0(funcs, MAX_FUNCS);
	int nd = 0;
	for (int i = 0; i < nf; i++) {
		const struct pci_func *f = &funcs[i];
		kprintf("info pci %02x:%02x.%x %04x:%04x%s\n", f->bus, f->dev, f->fn, f->vendor,
			f->device, is_virtio_blk(f) ? " virtio-blk" : "");
		if (!is_virtio_blk(f))
			continue;
		if (nd == MAX_DISKS)
			fail("more than %d virtio-blk devices", MAX_DISKS);
		disks[nd].index = nd;
		disks[nd].allow_event_idx = opt.event_idx;
		disks[nd].allow_indirect = opt.indirect;
		disks[nd].pci = *f;
		nd++;
	}
	if (nd == 0)
		fail("no virtio-blk device on PCI bus 0");
	if (opt.expect_disks >= 0 && nd != opt.expect_disks)
		fail("found %d virtio-blk device(s), cmdline says disks=%d", nd, opt.expect_disks);
	kprintf("ok   found %d virtio-blk device(s)\n", nd);

	for (int i = 0; i < nd; i++) {
		pci_enable(&disks[i].pci);
		vdev_init(&disks[i]);
	}
	for (int i = 0; i < nd; i++)
		blk_test_disk(&disks[i]);
	api_checks_run(&opt, disks, &nd, MAX_DISKS);
	if (irq_unexpected)
		fail("interrupt on vector 0x%x, which no device was given", irq_unexpected);
	kprintf("ok   no interrupt arrived on an unassigned vector\n");
	for (int i = 0; i < nd; i++) {
		u32 n = irq_count[disks[i].config_cpu_vector];
		if (n)
			kprintf("info disk%d: %u configuration-change interrupt(s)\n", i, n);
	}
	if (opt.park) {
		kprintf("RESULT: PASS\n");
		kprintf("info parked: waiting for the host\n");
		for (;;)
			sti_hlt();
	}
	pass();
}
