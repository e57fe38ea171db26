/*
 * virtio_pci.c - the virtio-pci modern transport for one virtio-blk device:
 * capability discovery, MSI-X table programming, the virtio 1.x init
 * sequence (reset, ACKNOWLEDGE, DRIVER, features, FEATURES_OK, queues,
 * DRIVER_OK) and reading the virtio-blk configuration.
 *
 * In:  a struct vdev whose pci record was filled by the PCI scan and whose
 *      BARs are enabled. Everything the device reports (capability offsets,
 *      queue sizes, notify offsets, config values) is bounds-checked.
 * Out: the struct vdev filled in: register addresses, negotiated features,
 *      config, and live queues.
 */
#include "irq.h"
#include "virtio.h"

/* Capability types (virtio 1.x, 4.1.4). */
#define CAP_COMMON 1
#define CAP_NOTIFY 2
#define CAP_ISR 3
#define CAP_DEVICE 4

/* Common configuration registers. */
#define CC_DEVICE_FEATURE_SELECT 0x00
#define CC_DEVICE_FEATURE 0x04
#define CC_DRIVER_FEATURE_SELECT 0x08
#define CC_DRIVER_FEATURE 0x0C
#define CC_CONFIG_MSIX_VECTOR 0x10
#define CC_NUM_QUEUES 0x12
#define CC_DEVICE_STATUS 0x14
#define CC_CONFIG_GENERATION 0x15
#define CC_QUEUE_SELECT 0x16
#define CC_QUEUE_SIZE 0x18
#define CC_QUEUE_MSIX_VECTOR 0x1A
#define CC_QUEUE_ENABLE 0x1C
#define CC_QUEUE_NOTIFY_OFF 0x1E
#define CC_QUEUE_DESC 0x20
#define CC_QUEUE_DRIVER 0x28
#define CC_QUEUE_DEVICE 0x30
#define CC_MIN_LEN 0x38

#define STATUS_ACKNOWLEDGE 1
#define STATUS_DRIVER 2
#define STATUS_DRIVER_OK 4
#define STATUS_FEATURES_OK 8
#define STATUS_NEEDS_RESET 0x40
#define STATUS_FAILED 0x80
#define NO_VECTOR 0xFFFF

#define MSIX_CTRL_ENABLE 0x8000
#define MSIX_CTRL_FUNC_MASK 0x4000
#define MSI_ADDR_BASE 0xFEE00000u

/* What we accept when offered. */
#define WANTED_FEATURES                                                                            \
	((1UL << VIRTIO_BLK_F_SIZE_MAX) | (1UL << VIRTIO_BLK_F_SEG_MAX) |                         \
	 (1UL << VIRTIO_BLK_F_RO) | (1UL << VIRTIO_BLK_F_BLK_SIZE) | (1UL << VIRTIO_BLK_F_FLUSH) | \
	 (1UL << VIRTIO_BLK_F_MQ) | (1UL << VIRTIO_BLK_F_DISCARD) |                                \
	 (1UL << VIRTIO_BLK_F_WRITE_ZEROES) | (1UL << VIRTIO_F_VERSION_1) |                        \
	 (1UL << VIRTIO_F_ACCESS_PLATFORM))

#define DEV_FMT "disk%d (%02x:%02x.%x)"
#define DEV_ARGS(d) (d)->index, (d)->pci.bus, (d)->pci.dev, (d)->pci.fn

/* Address of a capability's structure, checked against its BAR. */
static u64 cap_region(struct vdev *d, u8 cap, u32 *len_out)
{
	u8 bar = pci_read8(&d->pci, (u8)(cap + 4));
	u32 off = pci_read32(&d->pci, (u8)(cap + 8));
	u32 len = pci_read32(&d->pci, (u8)(cap + 12));
	if (bar >= PCI_MAX_BARS || d->pci.bar_size[bar] == 0)
		fail(DEV_FMT ": virtio capability at 0x%x names BAR%u, which is not a memory BAR",
		     DEV_ARGS(d), cap, bar);
	if ((u64)off + len > d->pci.bar_size[bar])
		fail(DEV_FMT ": virtio capability at 0x%x (0x%x+0x%x) exceeds BAR%u size 0x%lx",
		     DEV_ARGS(d), cap, off, len, bar, d->pci.bar_size[bar]);
	*len_out = len;
	return d->pci.bar_addr[bar] + off;
}

static void find_caps(struct vdev *d)
{
	u32 len, common_len = 0, isr_len = 0;
	for (u8 cap = pci_find_cap(&d->pci, PCI_CAP_ID_VNDR, 0); cap;
	     cap = pci_find_cap(&d->pci, PCI_CAP_ID_VNDR, cap)) {
		u8 type = pci_read8(&d->pci, (u8)(cap + 3));
		if (type == CAP_COMMON && !d->common) {
			d->common = cap_region(d, cap, &common_len);
		} else if (type == CAP_NOTIFY && !d->notify_base) {
			d->notify_base = cap_region(d, cap, &d->notify_len);
			d->notify_mult = pci_read32(&d->pci, (u8)(cap + 16));
		} else if (type == CAP_ISR && !d->isr) {
			d->isr = cap_region(d, cap, &isr_len);
		} else if (type == CAP_DEVICE && !d->devcfg) {
			d->devcfg = cap_region(d, cap, &len);
			d->devcfg_len = len;
		}
	}
	if (!d->common || !d->notify_base || !d->isr || !d->devcfg)
		fail(DEV_FMT ": missing virtio capability (common %s, notify %s, isr %s, device %s)",
		     DEV_ARGS(d), d->common ? "ok" : "MISSING", d->notify_base ? "ok" : "MISSING",
		     d->isr ? "ok" : "MISSING", d->devcfg ? "ok" : "MISSING");
	if (common_len < CC_MIN_LEN)
		fail(DEV_FMT ": common config is 0x%x bytes, need 0x%x", DEV_ARGS(d), common_len,
		     CC_MIN_LEN);
	kprintf("ok   " DEV_FMT ": virtio caps common 0x%lx notify 0x%lx (x%u) isr 0x%lx device "
		"0x%lx\n",
		DEV_ARGS(d), d->common, d->notify_base, d->notify_mult, d->isr, d->devcfg);
}

/* Enables MSI-X (function masked), programs entries 0..n-1 to the given
 * CPU vectors at this CPU's APIC id, unmasks them, then lifts the mask. */
static void setup_msix(struct vdev *d, const u32 *cpu_vectors, u32 n)
{
	u8 cap = pci_find_cap(&d->pci, PCI_CAP_ID_MSIX, 0);
	if (!cap)
		fail(DEV_FMT ": no MSI-X capability", DEV_ARGS(d));
	u16 ctrl = pci_read16(&d->pci, (u8)(cap + 2));
	u32 table = pci_read32(&d->pci, (u8)(cap + 4));
	u32 bir = table & 7, off = table & ~7u;
	d->msix_entries = (ctrl & 0x7FF) + 1u;
	if (d->msix_entries < n)
		fail(DEV_FMT ": MSI-X table has %u entries, need %u (config + %u queues)", DEV_ARGS(d),
		     d->msix_entries, n, n - 1);
	if (bir >= PCI_MAX_BARS || (u64)off + 16UL * d->msix_entries > d->pci.bar_size[bir])
		fail(DEV_FMT ": MSI-X table (BAR%u + 0x%x, %u entries) is outside its BAR", DEV_ARGS(d),
		     bir, off, d->msix_entries);
	d->msix_cap = cap;
	d->msix_table = d->pci.bar_addr[bir] + off;
	pci_write16(&d->pci, (u8)(cap + 2), (u16)(ctrl | MSIX_CTRL_ENABLE | MSIX_CTRL_FUNC_MASK));
	for (u32 e = 0; e < n; e++) {
		u64 ent = d->msix_table + 16UL * e;
		mmio_write32(ent + 0, MSI_ADDR_BASE | (irq_apic_id << 12));
		mmio_write32(ent + 4, 0);
		mmio_write32(ent + 8, cpu_vectors[e]);
		mmio_write32(ent + 12, 0); /* unmask */
		if (mmio_read32(ent + 8) != cpu_vectors[e] || (mmio_read32(ent + 12) & 1))
			fail(DEV_FMT ": MSI-X entry %u did not keep data/unmask", DEV_ARGS(d), e);
	}
	pci_write16(&d->pci, (u8)(cap + 2), (u16)((ctrl | MSIX_CTRL_ENABLE) & ~MSIX_CTRL_FUNC_MASK));
	u16 now = pci_read16(&d->pci, (u8)(cap + 2));
	if ((now & (MSIX_CTRL_ENABLE | MSIX_CTRL_FUNC_MASK)) != MSIX_CTRL_ENABLE)
		fail(DEV_FMT ": MSI-X control is 0x%x after enabling", DEV_ARGS(d), now);
	kprintf("ok   " DEV_FMT ": MSI-X enabled, %u of %u entries -> vectors 0x%x..0x%x\n",
		DEV_ARGS(d), n, d->msix_entries, cpu_vectors[0], cpu_vectors[n - 1]);
}

static u8 status_read(struct vdev *d) { return mmio_read8(d->common + CC_DEVICE_STATUS); }

static void status_add(struct vdev *d, u8 bits)
{
	mmio_write8(d->common + CC_DEVICE_STATUS, status_read(d) | bits);
}

void vdev_reset(struct vdev *d)
{
	mmio_write8(d->common + CC_DEVICE_STATUS, 0);
	u64 start = irq_ticks;
	while (status_read(d) != 0) {
		if (irq_ticks - start > IRQ_TICKS_PER_SECOND)
			fail(DEV_FMT ": device status stays 0x%x after reset", DEV_ARGS(d),
			     status_read(d));
		__asm__ __volatile__("pause");
	}
}

static u64 read_features(struct vdev *d)
{
	mmio_write32(d->common + CC_DEVICE_FEATURE_SELECT, 0);
	u64 lo = mmio_read32(d->common + CC_DEVICE_FEATURE);
	mmio_write32(d->common + CC_DEVICE_FEATURE_SELECT, 1);
	u64 hi = mmio_read32(d->common + CC_DEVICE_FEATURE);
	return lo | (hi << 32);
}

static void write_features(struct vdev *d, u64 f)
{
	mmio_write32(d->common + CC_DRIVER_FEATURE_SELECT, 0);
	mmio_write32(d->common + CC_DRIVER_FEATURE, (u32)f);
	mmio_write32(d->common + CC_DRIVER_FEATURE_SELECT, 1);
	mmio_write32(d->common + CC_DRIVER_FEATURE, (u32)(f >> 32));
}

static u32 cfg32(struct vdev *d, u32 off)
{
	return off + 4 <= d->devcfg_len ? mmio_read32(d->devcfg + off) : 0;
}

void vdev_read_config(struct vdev *d)
{
	struct blk_config *c = &d->cfg;
	/* Re-read until config_generation is stable, so the two halves of
	 * capacity belong together (bounded: a device that keeps changing
	 * fails). */
	for (int tries = 0;; tries++) {
		if (tries == 16)
			fail(DEV_FMT ": config_generation never settles", DEV_ARGS(d));
		u8 gen = mmio_read8(d->common + CC_CONFIG_GENERATION);
		c->capacity = cfg32(d, 0) | ((u64)cfg32(d, 4) << 32);
		c->size_max = cfg32(d, 8);
		c->seg_max = cfg32(d, 12);
		c->blk_size = cfg32(d, 20);
		c->num_queues = (u16)(cfg32(d, 32) >> 16);
		c->max_discard_sectors = cfg32(d, 36);
		c->max_discard_seg = cfg32(d, 40);
		c->discard_sector_alignment = cfg32(d, 44);
		c->max_write_zeroes_sectors = cfg32(d, 48);
		c->max_write_zeroes_seg = cfg32(d, 52);
		c->write_zeroes_may_unmap = (u8)cfg32(d, 56);
		if (mmio_read8(d->common + CC_CONFIG_GENERATION) == gen)
			break;
	}
}

static void setup_queue(struct vdev *d, u16 q, u16 msix_entry)
{
	struct virtq *vq = &d->vq[q];
	u64 cc = d->common;
	mmio_write16(cc + CC_QUEUE_SELECT, q);
	u16 max = mmio_read16(cc + CC_QUEUE_SIZE);
	if (max == 0)
		fail(DEV_FMT ": queue %u has size 0", DEV_ARGS(d), q);
	if (mmio_read16(cc + CC_QUEUE_ENABLE) != 0)
		fail(DEV_FMT ": queue %u is enabled right after reset", DEV_ARGS(d), q);
	u16 size = 1;
	while ((u32)size * 2 <= max && size * 2 <= VQ_SIZE_CAP)
		size = (u16)(size * 2);
	if (size != max)
		mmio_write16(cc + CC_QUEUE_SIZE, size);
	vq->index = q;
	vq->size = size;
	vq->desc = zalloc(16UL * size, 16);
	vq->avail = zalloc(6UL + 2UL * size, 2);
	vq->used = zalloc(6UL + 8UL * size, 4);
	if (vdev_has(d, VIRTIO_F_INDIRECT_DESC))
		vq->indirect = zalloc(16UL * VQ_INDIRECT_MAX, 16);
	if (!vq->desc || !vq->avail || !vq->used ||
	    (vdev_has(d, VIRTIO_F_INDIRECT_DESC) && !vq->indirect))
		fail("out of ring memory at " DEV_FMT " queue %u", DEV_ARGS(d), q);
	mmio_write64(cc + CC_QUEUE_DESC, (u64)vq->desc);
	mmio_write64(cc + CC_QUEUE_DRIVER, (u64)vq->avail);
	mmio_write64(cc + CC_QUEUE_DEVICE, (u64)vq->used);
	mmio_write16(cc + CC_QUEUE_MSIX_VECTOR, msix_entry);
	u16 got = mmio_read16(cc + CC_QUEUE_MSIX_VECTOR);
	if (got != msix_entry)
		fail(DEV_FMT ": queue %u MSI-X vector reads 0x%x after writing %u%s", DEV_ARGS(d), q,
		     got, msix_entry, got == NO_VECTOR ? " (NO_VECTOR: refused)" : "");
	u32 noff = (u32)mmio_read16(cc + CC_QUEUE_NOTIFY_OFF) * d->notify_mult;
	if ((u64)noff + 2 > d->notify_len)
		fail(DEV_FMT ": queue %u notify offset 0x%x is outside the notify region (0x%x)",
		     DEV_ARGS(d), q, noff, d->notify_len);
	vq->notify_addr = d->notify_base + noff;
	mmio_write16(cc + CC_QUEUE_ENABLE, 1);
	if (mmio_read16(cc + CC_QUEUE_ENABLE) != 1)
		fail(DEV_FMT ": queue %u enable did not stick", DEV_ARGS(d), q);
	kprintf("ok   " DEV_FMT ": queue %u size %u (max %u), MSI-X entry %u -> vector 0x%x, "
		"notify 0x%lx\n",
		DEV_ARGS(d), q, size, max, msix_entry, vq->cpu_vector, vq->notify_addr);
}

u8 vdev_config_generation(struct vdev *d) { return mmio_read8(d->common + CC_CONFIG_GENERATION); }

void vdev_init(struct vdev *d)
{
	find_caps(d);
	vdev_reset(d);
	status_add(d, STATUS_ACKNOWLEDGE);
	status_add(d, STATUS_DRIVER);

	u64 offered = read_features(d);
	if (!((offered >> VIRTIO_F_VERSION_1) & 1))
		fail(DEV_FMT ": VIRTIO_F_VERSION_1 not offered (features 0x%lx)", DEV_ARGS(d),
		     offered);
	d->features = offered & WANTED_FEATURES;
	if (d->allow_event_idx)
		d->features |= offered & (1UL << VIRTIO_F_RING_EVENT_IDX);
	if (d->allow_indirect)
		d->features |= offered & (1UL << VIRTIO_F_INDIRECT_DESC);
	write_features(d, d->features);
	status_add(d, STATUS_FEATURES_OK);
	if (!(status_read(d) & STATUS_FEATURES_OK))
		fail(DEV_FMT ": FEATURES_OK did not stick (status 0x%x)", DEV_ARGS(d), status_read(d));
	kprintf("ok   " DEV_FMT ": features offered 0x%lx, accepted 0x%lx\n", DEV_ARGS(d), offered,
		d->features);

	vdev_read_config(d);
	kprintf("info " DEV_FMT ": capacity %lu sectors, size_max %u, seg_max %u, blk_size %u, "
		"num_queues %u\n",
		DEV_ARGS(d), d->cfg.capacity, d->cfg.size_max, d->cfg.seg_max, d->cfg.blk_size,
		d->cfg.num_queues);
	u16 dev_queues = mmio_read16(d->common + CC_NUM_QUEUES);
	u16 nq = vdev_has(d, VIRTIO_BLK_F_MQ) ? d->cfg.num_queues : 1;
	if (nq == 0 || nq > dev_queues)
		fail(DEV_FMT ": config num_queues %u but common num_queues %u", DEV_ARGS(d), nq,
		     dev_queues);
	if (nq > VQ_MAX_QUEUES) {
		kprintf("skip " DEV_FMT ": using %u of %u queues (guest limit)\n", DEV_ARGS(d),
			VQ_MAX_QUEUES, nq);
		nq = VQ_MAX_QUEUES;
	}
	d->num_queues = nq;

	u32 vectors[VQ_MAX_QUEUES + 1];
	d->config_cpu_vector = vectors[0] = irq_alloc_vector();
	for (u16 q = 0; q < nq; q++)
		d->vq[q].cpu_vector = vectors[q + 1] = irq_alloc_vector();
	setup_msix(d, vectors, nq + 1u);

	mmio_write16(d->common + CC_CONFIG_MSIX_VECTOR, 0);
	u16 got = mmio_read16(d->common + CC_CONFIG_MSIX_VECTOR);
	if (got != 0)
		fail(DEV_FMT ": config MSI-X vector reads 0x%x after writing 0%s", DEV_ARGS(d), got,
		     got == NO_VECTOR ? " (NO_VECTOR: refused)" : "");
	for (u16 q = 0; q < nq; q++)
		setup_queue(d, q, (u16)(q + 1));

	status_add(d, STATUS_DRIVER_OK);
	u8 st = status_read(d);
	if (st & (STATUS_NEEDS_RESET | STATUS_FAILED) || !(st & STATUS_DRIVER_OK))
		fail(DEV_FMT ": status 0x%x after DRIVER_OK", DEV_ARGS(d), st);
	kprintf("ok   " DEV_FMT ": DRIVER_OK, %u queue(s)\n", DEV_ARGS(d), nq);
}
