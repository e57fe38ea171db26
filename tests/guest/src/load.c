/*
 * load.c - the load mode: keeps every queue of every disk busy with `depth`
 * requests of `bs` bytes each for `load=SECONDS`, then reports what every
 * queue completed, for benchmarks of the VMM's device path.
 *
 * The guest's own work per request is kept small (on some hosts KVM
 * emulates guest code): each in-flight slot owns a fixed chain of three
 * descriptors (header, data, status) written once; a completion rewrites
 * only the header's sector and the status byte and puts the same head back
 * on the avail ring; each pass over a queue ends with one avail-index store
 * and at most one notification (EVENT_IDX rules). Data is never checked,
 * the status byte of every request is. Completions wake the guest through
 * the queue's MSI-X vector (used_event re-armed before every hlt), as a
 * Linux guest waits for them.
 *
 * Clock: kvm-clock (clock.c) when KVM offers it, else LAPIC timer ticks
 * (irq.c, 10 ms each; the load then starts on a tick edge). The load is
 * put in for the set time by that clock and ends when the last request
 * in flight has completed; the elapsed time runs to that completion.
 *
 * In:  initialised disks, the load options. Out: the LOAD lines
 *      (tests/guest/README.md), the requests added to blk_counts (the
 *      COUNT lines), or RESULT: FAIL naming the disk and queue.
 */
#include "load.h"
#include "blk_test.h"
#include "clock.h"
#include "irq.h"

#define SECTOR 512u
#define T_IN 0
#define T_OUT 1
#define S_OK 0
#define STATUS_UNSET 0xFF
/* Quiet time between "LOAD ready" and the load, for the host to sample
 * its counters (the VMM does no device work meanwhile). */
#define READY_QUIET_TICKS 50
/* A queue with requests in flight and no completion for this long fails. */
#define STALL_TICKS (20 * IRQ_TICKS_PER_SECOND)
/* Descriptors one request uses. */
#define CHAIN_LEN 3
#define LOAD_MAX_QUEUES 64
#define LOAD_MAX_SLOTS 4096
#define LOAD_BUF_BYTES (2u * 1024 * 1024)

struct load_hdr {
	u32 type;
	u32 reserved;
	u64 sector;
};

struct load_queue {
	struct vdev *d;
	int q;
	u32 first_slot; /* this queue's slots in slot_hdr/slot_status */
	u64 next_block; /* sequential: the next block; random: generator state */
	u32 inflight;
	u64 done;
	u32 kicks;
	u32 irqs_before;
	u64 max_lat_ns; /* the longest request, submission to reap (kvm-clock) */
};

/* Per slot (all queues): the request header and status byte. Every field
 * is written before use: .noinit spares zeroing them. */
static struct load_hdr slot_hdr[LOAD_MAX_SLOTS] __attribute__((aligned(16), section(".noinit")));
static volatile u8 slot_status[LOAD_MAX_SLOTS] __attribute__((section(".noinit")));
static u8 slot_busy[LOAD_MAX_SLOTS] __attribute__((section(".noinit")));
/* The longest request completed in each second of the load (kvm-clock),
 * for the first LAT_SECONDS seconds. */
#define LAT_SECONDS 120
static u32 lat_by_second_us[LAT_SECONDS];
static u64 lat_start_ns;
/* When each slot's request was put on the ring (kvm-clock ns; 0 without). */
static u64 slot_t[LOAD_MAX_SLOTS] __attribute__((section(".noinit")));
/* Data buffers: slot i of every queue uses [i * bs, (i + 1) * bs). */
static u8 load_buf[LOAD_BUF_BYTES] __attribute__((aligned(4096), section(".noinit")));
static struct load_queue lqs[LOAD_MAX_QUEUES];

static const char *const rw_names[] = {"randread", "randwrite", "read", "write"};

static int is_write(int rw) { return rw == LOAD_RANDWRITE || rw == LOAD_WRITE; }
static int is_random(int rw) { return rw == LOAD_RANDREAD || rw == LOAD_RANDWRITE; }

/* The block (of bs bytes) the queue's next request goes to. */
static u64 next_block(struct load_queue *lq, int rw, u64 blocks)
{
	if (is_random(rw)) {
		u64 x = lq->next_block; /* xorshift64 */
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		lq->next_block = x;
		return x % blocks;
	}
	u64 b = lq->next_block;
	lq->next_block = b + 1 == blocks ? 0 : b + 1;
	return b;
}

/* Writes the fixed chains of lq's slots into its descriptor table. */
static void setup_queue(struct load_queue *lq, const struct boot_options *opt, u64 blocks,
			int nq_of_disk)
{
	struct vdev *d = lq->d;
	struct virtq *vq = &d->vq[lq->q];
	int depth = opt->load_depth;
	if (vq->inflight)
		fail("internal: disk%d queue %d has a batch in flight", d->index, lq->q);
	if (CHAIN_LEN * depth > vq->size)
		fail("disk%d queue %d: depth=%d needs %d descriptors, the ring has %u (depth <= %u)",
		     d->index, lq->q, depth, CHAIN_LEN * depth, vq->size, vq->size / CHAIN_LEN);
	if (vdev_has(d, VIRTIO_BLK_F_SIZE_MAX) && d->cfg.size_max && opt->load_bs > d->cfg.size_max)
		fail("disk%d: bs=%u exceeds the device's size_max %u", d->index, opt->load_bs,
		     d->cfg.size_max);
	if (is_random(opt->load_rw))
		lq->next_block = 0x9E3779B97F4A7C15UL ^ ((u64)d->index << 32) ^ ((u64)lq->q << 16) ^ 1;
	else
		lq->next_block = blocks * (u64)lq->q / (u64)nq_of_disk;
	u16 data_flags = (u16)(VRING_DESC_F_NEXT | (is_write(opt->load_rw) ? 0 : VRING_DESC_F_WRITE));
	for (int i = 0; i < depth; i++) {
		u32 s = lq->first_slot + (u32)i;
		u16 h = (u16)(CHAIN_LEN * i);
		vq->desc[h] = (struct vring_desc){(u64)&slot_hdr[s], sizeof(struct load_hdr),
						  VRING_DESC_F_NEXT, (u16)(h + 1)};
		vq->desc[h + 1] = (struct vring_desc){(u64)(load_buf + (u64)i * opt->load_bs),
						      opt->load_bs, data_flags, (u16)(h + 2)};
		vq->desc[h + 2] = (struct vring_desc){(u64)&slot_status[s], 1, VRING_DESC_F_WRITE, 0};
		slot_hdr[s].type = is_write(opt->load_rw) ? T_OUT : T_IN;
		slot_hdr[s].reserved = 0;
		slot_busy[s] = 0;
	}
}

/* Puts slot i of lq (head CHAIN_LEN * i) on the avail ring for the next
 * block at time now (kvm-clock ns); the caller publishes. */
static void submit(struct load_queue *lq, int i, int rw, u64 blocks, u32 bs, u64 now)
{
	struct virtq *vq = &lq->d->vq[lq->q];
	u32 s = lq->first_slot + (u32)i;
	slot_t[s] = now;
	slot_hdr[s].sector = next_block(lq, rw, blocks) * (bs / SECTOR);
	slot_status[s] = STATUS_UNSET;
	slot_busy[s] = 1;
	vq->avail->ring[vq->avail_idx % vq->size] = (u16)(CHAIN_LEN * i);
	vq->avail_idx++;
	lq->inflight++;
}

/* Consumes lq's used entries (seen at time now, kvm-clock ns: the
 * latency of each is now minus its submission); resubmits each slot unless
 * `stopping`, then publishes. Returns the number of completions. */
static u32 reap(struct load_queue *lq, int stopping, int rw, u64 blocks, u32 bs, int depth,
		u64 now)
{
	struct vdev *d = lq->d;
	struct virtq *vq = &d->vq[lq->q];
	u16 used = *(volatile u16 *)&vq->used->idx;
	u16 old_avail = vq->avail_idx;
	u32 n = 0;
	if ((u16)(used - vq->last_used) > lq->inflight)
		fail("disk%d queue %d: used idx moved by %u with %u requests in flight", d->index,
		     lq->q, (u16)(used - vq->last_used), lq->inflight);
	barrier();
	while (vq->last_used != used) {
		u32 id = vq->used->ring[vq->last_used % vq->size].id;
		vq->last_used++;
		u32 i = id / CHAIN_LEN;
		u32 s = lq->first_slot + i;
		if (id % CHAIN_LEN || i >= (u32)depth || !slot_busy[s])
			fail("disk%d queue %d: used id %u is not an outstanding head", d->index, lq->q,
			     id);
		if (slot_status[s] != S_OK)
			fail("disk%d queue %d: load %s at sector %lu gave status %u", d->index, lq->q,
			     rw_names[rw], slot_hdr[s].sector, slot_status[s]);
		u64 lat = now - slot_t[s];
		if (lat > lq->max_lat_ns)
			lq->max_lat_ns = lat;
		u64 sec = (now - lat_start_ns) / 1000000000UL;
		if (now && sec < LAT_SECONDS && lat / 1000 > lat_by_second_us[sec])
			lat_by_second_us[sec] = (u32)(lat / 1000);
		slot_busy[s] = 0;
		lq->inflight--;
		lq->done++;
		n++;
		if (!stopping)
			submit(lq, (int)i, rw, blocks, bs, now);
	}
	if (vq->avail_idx != old_avail)
		lq->kicks += (u32)virtq_publish(d, lq->q, old_avail);
	return n;
}

/* Sleeps until the next LAPIC tick. */
static void wait_tick(void)
{
	u64 t = irq_ticks;
	while (irq_ticks == t)
		sti_hlt();
}

void load_run(const struct boot_options *opt, struct vdev *disks, int nd)
{
	int rw = opt->load_rw, depth = opt->load_depth;
	u32 bs = opt->load_bs;
	int nq = 0;
	u32 slots = 0;
	if ((u64)depth * bs > LOAD_BUF_BYTES)
		fail("load: depth=%d x bs=%u is more than the guest's %u-byte buffer", depth, bs,
		     LOAD_BUF_BYTES);
	for (int k = 0; k < nd; k++) {
		struct vdev *d = &disks[k];
		if (is_write(rw) && vdev_has(d, VIRTIO_BLK_F_RO))
			fail("load: disk%d is read-only, rw=%s needs a writable disk", d->index,
			     rw_names[rw]);
		u64 blocks = d->cfg.capacity * SECTOR / bs;
		if (blocks == 0)
			fail("load: disk%d (%lu sectors) is smaller than bs=%u", d->index,
			     d->cfg.capacity, bs);
		for (int q = 0; q < d->num_queues; q++) {
			if (nq == LOAD_MAX_QUEUES || slots + (u32)depth > LOAD_MAX_SLOTS)
				fail("load: more than %d queues or %d requests in flight", LOAD_MAX_QUEUES,
				     LOAD_MAX_SLOTS);
			lqs[nq] = (struct load_queue){.d = d, .q = q, .first_slot = slots};
			setup_queue(&lqs[nq], opt, blocks, d->num_queues);
			slots += (u32)depth;
			nq++;
		}
	}
	if (is_write(rw))
		fill64(load_buf, 0x44414F4C44414F4CUL, (usize)depth * bs); /* "LOADLOAD" */

	kprintf("LOAD ready rw=%s bs=%u depth=%d seconds=%d disks=%d queues=%d\n", rw_names[rw],
		bs, depth, opt->load_seconds, nd, nq);
	for (int t = 0; t < READY_QUIET_TICKS; t++)
		wait_tick();
	int kvm_clock = clock_init();
	wait_tick(); /* start on a tick edge */
	kprintf("LOAD start\n");
	u64 start = irq_ticks;
	u64 start_ns = kvm_clock ? clock_ns() : 0;
	lat_start_ns = start_ns;
	u64 end_at = start + (u64)opt->load_seconds * IRQ_TICKS_PER_SECOND;
	u64 end_ns = (u64)opt->load_seconds * 1000000000UL;

	for (int k = 0; k < nq; k++) {
		struct load_queue *lq = &lqs[k];
		struct virtq *vq = &lq->d->vq[lq->q];
		u64 blocks = lq->d->cfg.capacity * SECTOR / bs;
		u16 old_avail = vq->avail_idx;
		lq->irqs_before = irq_count[vq->cpu_vector];
		u64 now = kvm_clock ? clock_ns() : 0;
		for (int i = 0; i < depth; i++)
			submit(lq, i, rw, blocks, bs, now);
		lq->kicks += (u32)virtq_publish(lq->d, lq->q, old_avail);
	}

	u64 last_progress = start;
	int stopping = 0;
	/* Interrupts stay on while requests are reaped (the timer must tick:
	 * KVM drops a tick that falls due while the last one still waits);
	 * they are off only from the last look at the rings to the hlt. */
	for (;;) {
		u32 inflight = 0, progress = 0;
		u64 now_ns = kvm_clock ? clock_ns() : 0;
		for (int k = 0; k < nq; k++) {
			struct load_queue *lq = &lqs[k];
			u64 blocks = lq->d->cfg.capacity * SECTOR / bs;
			progress += reap(lq, stopping, rw, blocks, bs, depth, now_ns);
			inflight += lq->inflight;
		}
		u64 now = irq_ticks;
		if (progress)
			last_progress = now;
		if (!stopping && (kvm_clock ? clock_ns() - start_ns >= end_ns : now >= end_at))
			stopping = 1;
		if (stopping && inflight == 0)
			break;
		if (progress)
			continue;
		cli();
		int again = 0;
		for (int k = 0; k < nq; k++)
			again |= lqs[k].inflight && virtq_arm_interrupt(lqs[k].d, lqs[k].q);
		if (again) {
			sti();
			continue;
		}
		if (now - last_progress > STALL_TICKS) {
			for (int k = 0; k < nq; k++) {
				if (lqs[k].inflight)
					fail("load: no completion on disk %d queue %d for 20 s (%u in flight)",
					     lqs[k].d->index, lqs[k].q, lqs[k].inflight);
			}
		}
		sti_hlt(); /* a completion's MSI-X or the timer wakes us */
	}
	u64 elapsed_us = kvm_clock ? (clock_ns() - start_ns) / 1000
				   : (irq_ticks - start) * (1000000 / IRQ_TICKS_PER_SECOND);
	u64 total = 0;
	int slowest = 0;
	for (int k = 0; k < nq; k++) {
		struct load_queue *lq = &lqs[k];
		struct virtq *vq = &lq->d->vq[lq->q];
		if (lq->max_lat_ns > lqs[slowest].max_lat_ns)
			slowest = k;
		kprintf("LOAD disk%d q%d requests=%lu kicks=%u interrupts=%u\n", lq->d->index, lq->q,
			lq->done, lq->kicks, irq_count[vq->cpu_vector] - lq->irqs_before);
		total += lq->done;
		if (lq->d->index >= 0 && lq->d->index < BLK_COUNT_DISKS) {
			struct blk_counts *c = &blk_counts[lq->d->index];
			if (is_write(rw)) {
				c->writes += lq->done;
				c->write_bytes += lq->done * bs;
			} else {
				c->reads += lq->done;
				c->read_bytes += lq->done * bs;
			}
		}
	}
	kprintf("LOAD done requests=%lu elapsed_us=%lu clock=%s iops=%lu\n", total, elapsed_us,
		kvm_clock ? "kvm" : "lapic", elapsed_us ? total * 1000000 / elapsed_us : 0);
	if (kvm_clock && nq) {
		kprintf("LOAD max_latency_us=%lu disk%d q%d\n", lqs[slowest].max_lat_ns / 1000,
			lqs[slowest].d->index, lqs[slowest].q);
		int secs = opt->load_seconds + 1 < LAT_SECONDS ? opt->load_seconds + 1 : LAT_SECONDS;
		kprintf("LOAD max_latency_us_by_second=");
		for (int k = 0; k < secs; k++)
			kprintf(k ? ",%u" : "%u", lat_by_second_us[k]);
		kprintf("\n");
	}
}
