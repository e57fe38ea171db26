/*
 * virtq.c - split virtqueue driver side: publish a batch of descriptor
 * chains, kick the queue once, sleep in hlt until every chain is in the used
 * ring and the queue's MSI-X vector fired (or a timeout counted in LAPIC
 * timer ticks expires), and consume the used entries in whatever order the
 * device completed them. With VIRTIO_F_RING_EVENT_IDX the kick and the
 * interrupt follow the avail_event / used_event rules.
 *
 * In:  chains of buffers in guest RAM; the used ring the device writes
 *      (untrusted: ids, counts and lengths are checked). Out: used lengths
 *      per chain, or RESULT: FAIL naming the disk and queue.
 */
#include "irq.h"
#include "virtio.h"

/* Generous: the host may be loaded by parallel builds. */
#define COMPLETION_TIMEOUT_TICKS (20 * IRQ_TICKS_PER_SECOND)

/* used_event lives after the avail ring, avail_event after the used ring. */
static volatile u16 *used_event(struct virtq *vq) { return &vq->avail->ring[vq->size]; }
static volatile u16 *avail_event(struct virtq *vq)
{
	return (volatile u16 *)&vq->used->ring[vq->size];
}

/* The kick rule of virtio 1.x 2.7.10: notify when the device's
 * avail_event lies in (old, new]. */
static int need_kick(struct virtq *vq, u16 old_idx, u16 new_idx)
{
	u16 event = *avail_event(vq);
	return (u16)(new_idx - event - 1) < (u16)(new_idx - old_idx);
}

static void fill_descs(struct vring_desc *table, u16 size, u16 first, const struct vchain *c)
{
	for (int i = 0; i < c->nsegs; i++) {
		u16 idx = (u16)((first + i) % size);
		struct vring_desc *desc = &table[idx];
		desc->addr = c->segs[i].addr;
		desc->len = c->segs[i].len;
		desc->flags = (u16)((c->segs[i].device_writes ? VRING_DESC_F_WRITE : 0) |
				    (i + 1 < c->nsegs ? VRING_DESC_F_NEXT : 0));
		desc->next = i + 1 < c->nsegs ? (u16)((idx + 1) % size) : 0;
	}
}

static u16 publish_chain(struct virtq *vq, const struct vchain *c)
{
	u16 head = vq->next_desc;
	if (c->indirect) {
		fill_descs(vq->indirect, VQ_INDIRECT_MAX, 0, c);
		vq->desc[head] = (struct vring_desc){(u64)vq->indirect,
						     (u32)(c->nsegs * sizeof(struct vring_desc)),
						     VRING_DESC_F_INDIRECT, 0};
		vq->next_desc = (u16)((head + 1) % vq->size);
	} else {
		fill_descs(vq->desc, vq->size, head, c);
		vq->next_desc = (u16)((head + c->nsegs) % vq->size);
	}
	vq->avail->ring[vq->avail_idx % vq->size] = head;
	vq->avail_idx++;
	return head;
}

/* Sleeps until `n` used entries are pending and the queue's vector fired
 * since irqs_before. */
static void wait_used(struct vdev *d, int q, u16 n, u32 irqs_before)
{
	struct virtq *vq = &d->vq[q];
	u64 start = irq_ticks;
	cli();
	for (;;) {
		u16 pending = (u16)(*(volatile u16 *)&vq->used->idx - vq->last_used);
		if (pending > n)
			fail("disk%d queue %d: used idx moved by %u for %u requests", d->index, q, pending,
			     n);
		int interrupted = irq_count[vq->cpu_vector] != irqs_before;
		if (pending == n && interrupted)
			break;
		if (pending < n && vdev_has(d, VIRTIO_F_RING_EVENT_IDX)) {
			/* Ask for an interrupt at the next completion, then
			 * look again in case it raced with the update. */
			*used_event(vq) = (u16)(vq->last_used + pending);
			mb();
			if ((u16)(*(volatile u16 *)&vq->used->idx - vq->last_used) != pending)
				continue;
		}
		if (irq_ticks - start > COMPLETION_TIMEOUT_TICKS) {
			if (pending == n)
				fail("no interrupt on disk %d queue %d (used idx %u, vector 0x%x)",
				     d->index, q, vq->used->idx, vq->cpu_vector);
			fail("no completion on disk %d queue %d (%u of %u requests completed)",
			     d->index, q, pending, n);
		}
		sti_hlt();
		cli();
	}
	sti();
	barrier();
}

void virtq_start(struct vdev *d, int q, const struct vchain *chains, int n)
{
	struct virtq *vq = &d->vq[q];
	int total = 0, indirect = 0;
	for (int i = 0; i < n && i < VQ_MAX_BATCH; i++) {
		total += chains[i].indirect ? 1 : chains[i].nsegs;
		if (chains[i].indirect) {
			indirect++;
			if (!vq->indirect || chains[i].nsegs > VQ_INDIRECT_MAX)
				fail("internal: disk%d queue %d cannot take an indirect chain of %d",
				     d->index, q, chains[i].nsegs);
		}
	}
	if (indirect > 1)
		fail("internal: disk%d queue %d: %d indirect chains in one batch", d->index, q,
		     indirect);
	if (vq->inflight)
		fail("internal: disk%d queue %d already has a batch in flight", d->index, q);
	if (n < 1 || n > VQ_MAX_BATCH || total > vq->size)
		fail("disk%d queue %d: %d chains of %d buffers do not fit a ring of %u", d->index, q, n,
		     total, vq->size);

	u16 old_idx = vq->avail_idx;
	for (int i = 0; i < n; i++) {
		vq->heads[i] = publish_chain(vq, &chains[i]);
		vq->writable[i] = 0;
		for (int k = 0; k < chains[i].nsegs; k++)
			vq->writable[i] += chains[i].segs[k].device_writes ? chains[i].segs[k].len : 0;
	}
	vq->inflight = (u16)n;
	if (vdev_has(d, VIRTIO_F_RING_EVENT_IDX))
		*used_event(vq) = vq->last_used;
	/* Count interrupts from before the device can see the batch: a device
	 * that polls its avail ring may complete it, and interrupt, before
	 * the kick below. */
	vq->irqs_before = irq_count[vq->cpu_vector];
	virtq_publish(d, q, old_idx);
}

int virtq_publish(struct vdev *d, int q, u16 old_idx)
{
	struct virtq *vq = &d->vq[q];
	barrier(); /* descriptors and ring entries before the index */
	vq->avail->idx = vq->avail_idx;
	mb(); /* the index before reading avail_event */

	if (!vdev_has(d, VIRTIO_F_RING_EVENT_IDX) || need_kick(vq, old_idx, vq->avail_idx)) {
		mmio_write16(vq->notify_addr, vq->index);
		return 1;
	}
	vq->kicks_suppressed++;
	return 0;
}

int virtq_arm_interrupt(struct vdev *d, int q)
{
	struct virtq *vq = &d->vq[q];
	if (vdev_has(d, VIRTIO_F_RING_EVENT_IDX)) {
		*used_event(vq) = vq->last_used;
		mb();
	}
	return *(volatile u16 *)&vq->used->idx != vq->last_used;
}

void virtq_finish(struct vdev *d, int q, u32 *used_len)
{
	struct virtq *vq = &d->vq[q];
	u16 n = vq->inflight;
	u8 done[VQ_MAX_BATCH] = {0};
	if (n == 0)
		fail("internal: disk%d queue %d has no batch in flight", d->index, q);
	wait_used(d, q, n, vq->irqs_before);
	vq->interrupts++;

	for (int k = 0; k < n; k++) {
		struct vring_used_elem e = vq->used->ring[vq->last_used % vq->size];
		vq->last_used++;
		int i = 0;
		while (i < n && (vq->heads[i] != e.id || done[i]))
			i++;
		if (i == n)
			fail("disk%d queue %d: used id %u is not an outstanding head", d->index, q, e.id);
		if (e.len > vq->writable[i])
			fail("disk%d queue %d: used len %u exceeds the chain's %u writable bytes",
			     d->index, q, e.len, vq->writable[i]);
		done[i] = 1;
		if (used_len)
			used_len[i] = e.len;
	}
	vq->inflight = 0;
}

void virtq_run_batch(struct vdev *d, int q, const struct vchain *chains, int n, u32 *used_len)
{
	virtq_start(d, q, chains, n);
	virtq_finish(d, q, used_len);
}
