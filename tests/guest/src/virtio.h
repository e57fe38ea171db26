/*
 * virtio.h - a virtio-blk device driven over virtio-pci modern with MSI-X:
 * the device record (virtio_pci.c fills it), split virtqueues (virtq.c).
 */
#ifndef GUEST_VIRTIO_H
#define GUEST_VIRTIO_H
#include "common.h"
#include "pci.h"

#define VIRTIO_VENDOR 0x1AF4
#define VIRTIO_DEV_BLK_MODERN 0x1042
#define VIRTIO_DEV_BLK_TRANSITIONAL 0x1001

/* Feature bits. */
#define VIRTIO_BLK_F_SIZE_MAX 1
#define VIRTIO_BLK_F_SEG_MAX 2
#define VIRTIO_BLK_F_RO 5
#define VIRTIO_BLK_F_BLK_SIZE 6
#define VIRTIO_BLK_F_FLUSH 9
#define VIRTIO_BLK_F_MQ 12
#define VIRTIO_BLK_F_DISCARD 13
#define VIRTIO_BLK_F_WRITE_ZEROES 14
#define VIRTIO_F_INDIRECT_DESC 28
#define VIRTIO_F_RING_EVENT_IDX 29
#define VIRTIO_F_VERSION_1 32
#define VIRTIO_F_ACCESS_PLATFORM 33

#define VQ_MAX_QUEUES 16
/* Most chains one virtq_run_batch call puts in flight. */
#define VQ_MAX_BATCH 16
/* Ring size we ask for when the device offers more. */
#define VQ_SIZE_CAP 256

struct vring_desc {
	u64 addr;
	u32 len;
	u16 flags;
	u16 next;
};
#define VRING_DESC_F_NEXT 1
#define VRING_DESC_F_WRITE 2
#define VRING_DESC_F_INDIRECT 4
/* Entries of the one indirect table each queue owns. */
#define VQ_INDIRECT_MAX 34

struct vring_avail {
	u16 flags;
	u16 idx;
	u16 ring[];
};

struct vring_used_elem {
	u32 id;
	u32 len;
};

struct vring_used {
	u16 flags;
	u16 idx;
	struct vring_used_elem ring[];
};

struct virtq {
	u16 index;
	u16 size;
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	u16 avail_idx;	/* next avail->idx we publish */
	u16 last_used;	/* used->idx we have consumed up to */
	u16 next_desc;	/* first descriptor of the next chain (rotates) */
	struct vring_desc *indirect; /* table for one indirect chain, or NULL */
	u64 notify_addr;
	u32 cpu_vector; /* IDT vector its MSI-X entry delivers */
	/* The batch in flight (virtq_start .. virtq_finish). */
	u16 inflight;
	u16 heads[VQ_MAX_BATCH];
	u32 writable[VQ_MAX_BATCH]; /* device-writable bytes per chain */
	u32 irqs_before;
	u32 interrupts;	      /* batches completed (each with an interrupt) */
	u32 kicks_suppressed; /* notifications skipped by EVENT_IDX */
};

/* virtio-blk device configuration (fields absent from a short config
 * region read as 0). */
struct blk_config {
	u64 capacity; /* 512-byte sectors */
	u32 size_max, seg_max, blk_size;
	u16 num_queues;
	u32 max_discard_sectors, max_discard_seg, discard_sector_alignment;
	u32 max_write_zeroes_sectors, max_write_zeroes_seg;
	u8 write_zeroes_may_unmap;
};

struct vdev {
	int index; /* disk number, in PCI scan order */
	int allow_event_idx; /* accept VIRTIO_F_RING_EVENT_IDX when offered */
	int allow_indirect;  /* accept VIRTIO_F_INDIRECT_DESC when offered */
	struct pci_func pci;
	u64 common, notify_base, isr, devcfg;
	u32 notify_mult, notify_len, devcfg_len;
	u8 msix_cap;
	u32 msix_entries;
	u64 msix_table;
	u32 config_cpu_vector;
	u64 features; /* negotiated */
	struct blk_config cfg;
	u16 num_queues;
	struct virtq vq[VQ_MAX_QUEUES];
};

static inline int vdev_has(const struct vdev *d, int bit) { return (d->features >> bit) & 1; }

/* Finds the capabilities, programs MSI-X, runs the virtio 1.x init sequence
 * and sets up every queue. Fails the run on any deviation. */
void vdev_init(struct vdev *d);
/* Writes status 0 and waits (bounded) until it reads back 0. */
void vdev_reset(struct vdev *d);
/* (Re-)reads the device config into d->cfg under a stable generation. */
void vdev_read_config(struct vdev *d);
/* The config generation byte. */
u8 vdev_config_generation(struct vdev *d);

/* One buffer of a descriptor chain. */
struct vseg {
	u64 addr;
	u32 len;
	int device_writes;
};

/* A descriptor chain: its buffers in order. With `indirect` (needs
 * VIRTIO_F_INDIRECT_DESC; at most one such chain per batch) the buffers go
 * in the queue's indirect table and the ring holds one descriptor. */
struct vchain {
	const struct vseg *segs;
	int nsegs;
	int indirect;
};

/* The two halves of virtq_run_batch, so batches on several queues can be
 * in flight at once: start publishes and kicks, finish waits and consumes.
 * One batch per queue at a time. */
void virtq_start(struct vdev *d, int q, const struct vchain *chains, int n);
void virtq_finish(struct vdev *d, int q, u32 *used_len);

/* Makes the ring entries added since avail index old_idx visible (one
 * index store) and notifies the queue unless EVENT_IDX says the device
 * does not need it; returns whether it notified. */
int virtq_publish(struct vdev *d, int q, u16 old_idx);
/* Before sleeping with interrupts off: with EVENT_IDX asks for an
 * interrupt at the next completion (used_event = last_used; without it the
 * device interrupts on every used-ring update anyway); returns 1 when a
 * completion is already waiting, so the caller must look again instead of
 * sleeping. */
int virtq_arm_interrupt(struct vdev *d, int q);

/* Puts n chains (n <= VQ_MAX_BATCH) on queue q with one notification,
 * waits until all completed (any order) with at least one interrupt, and
 * stores each chain's used length in used_len[i] (may be NULL). */
void virtq_run_batch(struct vdev *d, int q, const struct vchain *chains, int n, u32 *used_len);

#endif
