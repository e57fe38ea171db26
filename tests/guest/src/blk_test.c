/*
 * blk_test.c - the virtio-blk checks run on every queue of every disk, and
 * the on-disk layout they leave behind (documented in tests/guest/README.md;
 * keep the two in sync).
 *
 * Per queue q, region base B = q * 256 KiB (regions must lie in the first
 * 8 MiB and inside the disk, else the data checks of that queue are skipped):
 *   [B,        B+64K)   written with a position pattern, then with bytes 0x40+q
 *   [B+64K,    B+68K)   bytes 0x80+q
 *   [B+128K,   B+192K)  bytes 0xC0+q, then discarded (contents unspecified)
 *   [B+192K,   B+256K)  bytes 0xE0+q, then WRITE_ZEROES: reads as zeroes
 * Read-only disks are never written (one refused write per queue).
 *
 * In:  an initialised struct vdev. Out: one console line per check; the
 *      first failed check ends the run with RESULT: FAIL.
 */
#include "blk_test.h"

#define SECTOR 512u
#define REGION_STRIDE (256u * 1024)
#define TEST_AREA (8UL << 20)
#define BIG_LEN (64u * 1024)
#define SMALL_LEN 4096u
#define HUGE_LEN (128u * 1024) /* the one request larger than 64 KiB */
#define OFF_BIG 0u
#define OFF_SMALL (64u * 1024)
#define OFF_DISCARD (128u * 1024)
#define OFF_ZERO (192u * 1024)
#define POS_MAGIC 0x5EC7000000000000UL
#define POISON 0xA5A5A5A5A5A5A5A5UL
#define BYTES8(b) (0x0101010101010101UL * (u8)(b))
#define MAX_DATA_SEGS 32

#define T_IN 0
#define T_OUT 1
#define T_FLUSH 4
#define T_GET_ID 8
#define T_DISCARD 11
#define T_WRITE_ZEROES 13
#define T_UNKNOWN 0x7E
#define S_OK 0
#define S_IOERR 1
#define S_UNSUPP 2
#define WZ_FLAG_UNMAP 1

struct blk_hdr {
	u32 type;
	u32 reserved;
	u64 sector;
};

struct blk_range {
	u64 sector;
	u32 num_sectors;
	u32 flags;
};

/* Data buffers are always filled before use: .noinit spares zeroing them. */
static u8 wbuf[BIG_LEN + SMALL_LEN] __attribute__((aligned(4096), section(".noinit")));
static u8 rbuf[HUGE_LEN] __attribute__((aligned(4096), section(".noinit")));
static u8 snapshot[SMALL_LEN];
static struct blk_hdr hdr __attribute__((aligned(16)));
static struct blk_range range __attribute__((aligned(16)));
static volatile u8 status_byte;
static struct blk_hdr batch_hdr[VQ_MAX_BATCH] __attribute__((aligned(16)));
static volatile u8 batch_status[VQ_MAX_BATCH];
static char id_buf[24];

struct blk_counts blk_counts[BLK_COUNT_DISKS];

/* Counts one finished request of `type` that moved `bytes` of data. */
static void count_request(const struct vdev *d, u32 type, u64 bytes, u8 status)
{
	if (d->index < 0 || d->index >= BLK_COUNT_DISKS)
		return;
	struct blk_counts *c = &blk_counts[d->index];
	if (status != S_OK) {
		c->errors++;
		return;
	}
	switch (type) {
	case T_IN:
		c->reads++;
		c->read_bytes += bytes;
		break;
	case T_OUT:
		c->writes++;
		c->write_bytes += bytes;
		break;
	case T_FLUSH:
		c->flushes++;
		break;
	case T_DISCARD:
	case T_WRITE_ZEROES:
		c->discards++;
		break;
	default:
		break;
	}
}

/* One request: header, data buffers, status byte. Returns the status. */
static u8 blk_request(struct vdev *d, int q, u32 type, u64 sector, const struct vseg *data,
		      int ndata, int indirect)
{
	struct vseg segs[MAX_DATA_SEGS + 2];
	if (ndata > MAX_DATA_SEGS)
		fail("internal: %d data segments", ndata);
	hdr.type = type;
	hdr.reserved = 0;
	hdr.sector = sector;
	segs[0] = (struct vseg){(u64)&hdr, sizeof(hdr), 0};
	for (int i = 0; i < ndata; i++)
		segs[i + 1] = data[i];
	status_byte = 0xFF;
	segs[ndata + 1] = (struct vseg){(u64)&status_byte, 1, 1};
	struct vchain chain = {segs, ndata + 2, indirect};
	virtq_run_batch(d, q, &chain, 1, NULL);
	u8 s = status_byte;
	if (s == 0xFF)
		fail("disk%d queue %d: status byte not written for request type %u", d->index, q, type);
	u64 bytes = 0;
	for (int i = 0; i < ndata; i++)
		bytes += data[i].len;
	count_request(d, type, bytes, s);
	return s;
}

u8 blk_rw(struct vdev *d, int q, int write, u64 off, u8 *buf, u32 len)
{
	struct vseg data = {(u64)buf, len, !write};
	return blk_request(d, q, write ? T_OUT : T_IN, off / SECTOR, &data, 1, 0);
}

u8 blk_flush(struct vdev *d, int q) { return blk_request(d, q, T_FLUSH, 0, NULL, 0, 0); }

/* Cuts buf[0, len) into a first piece of `first` bytes (if non-zero) and
 * then `piece`-byte pieces, growing the pieces when the device's seg_max or
 * the ring would be exceeded and shrinking them to size_max. Returns the
 * number of pieces, 0 when the device's limits cannot be met. */
static int split(const struct vdev *d, int q, u8 *buf, u32 len, u32 first, u32 piece, int dw,
		 struct vseg *out)
{
	u32 size_max = vdev_has(d, VIRTIO_BLK_F_SIZE_MAX) ? d->cfg.size_max & ~(SECTOR - 1) : 0;
	u32 seg_limit = MAX_DATA_SEGS;
	if (vdev_has(d, VIRTIO_BLK_F_SEG_MAX) && d->cfg.seg_max < seg_limit)
		seg_limit = d->cfg.seg_max;
	if ((u32)d->vq[q].size - 2 < seg_limit)
		seg_limit = d->vq[q].size - 2u;
	if (vdev_has(d, VIRTIO_BLK_F_SIZE_MAX) && size_max == 0)
		return 0;
	for (int attempt = 0; attempt < 8; attempt++) {
		if (size_max && piece > size_max)
			piece = size_max;
		if (size_max && first > size_max)
			first = 0;
		u32 n = 0, pos = 0;
		while (pos < len && n <= seg_limit) {
			u32 want = (n == 0 && first) ? first : piece;
			u32 l = len - pos < want ? len - pos : want;
			if (n < seg_limit)
				out[n] = (struct vseg){(u64)(buf + pos), l, dw};
			n++;
			pos += l;
		}
		if (n <= seg_limit)
			return (int)n;
		first = 0;
		piece *= 2;
	}
	return 0;
}

/* One read or write request of len bytes at disk offset off, its buffer
 * cut as split() says; through the indirect table when `indirect`. */
static void transfer_ex(struct vdev *d, int q, int write, u64 off, u8 *buf, u32 len, u32 first,
			u32 piece, const char *what, int indirect)
{
	struct vseg data[MAX_DATA_SEGS];
	int n = split(d, q, buf, len, first, piece, !write, data);
	if (n == 0)
		fail("disk%d queue %d: cannot split %u bytes within the device's seg_max %u / "
		     "size_max %u",
		     d->index, q, len, d->cfg.seg_max, d->cfg.size_max);
	if (!write)
		fill64(buf, POISON, len);
	u8 s = blk_request(d, q, write ? T_OUT : T_IN, off / SECTOR, data, n, indirect);
	if (s != S_OK)
		fail("disk%d queue %d: %s %s of %u bytes at 0x%lx (%d segments) gave status %u",
		     d->index, q, what, write ? "write" : "read", len, off, n, s);
	kprintf("ok   disk%d q%d %-5s %-26s %6u bytes at 0x%06lx in %2d segment(s)%s\n", d->index,
		q, write ? "write" : "read", what, len, off, n, indirect ? ", indirect" : "");
}

static void transfer(struct vdev *d, int q, int write, u64 off, u8 *buf, u32 len, u32 first,
		     u32 piece, const char *what)
{
	transfer_ex(d, q, write, off, buf, len, first, piece, what, 0);
}

/* Moves len bytes as up to VQ_MAX_BATCH equal requests (header, one data
 * buffer, status) that are all in flight together: one notification, the
 * device may complete them in any order. */
static void batch_transfer(struct vdev *d, int q, int write, u64 off, u8 *buf, u32 len,
			   const char *what)
{
	struct vseg segs[VQ_MAX_BATCH][3];
	struct vchain chains[VQ_MAX_BATCH];
	int count = VQ_MAX_BATCH;
	while (count > 1 && (u32)count * 3 > d->vq[q].size)
		count /= 2;
	u32 chunk = len / (u32)count;
	if (vdev_has(d, VIRTIO_BLK_F_SIZE_MAX) && chunk > d->cfg.size_max) {
		kprintf("skip disk%d q%d batch %s: %u-byte requests exceed size_max %u\n", d->index,
			q, what, chunk, d->cfg.size_max);
		return;
	}
	if (!write)
		fill64(buf, POISON, len);
	for (int i = 0; i < count; i++) {
		batch_hdr[i] = (struct blk_hdr){write ? T_OUT : T_IN, 0,
						(off + (u64)i * chunk) / SECTOR};
		batch_status[i] = 0xFF;
		segs[i][0] = (struct vseg){(u64)&batch_hdr[i], sizeof(struct blk_hdr), 0};
		segs[i][1] = (struct vseg){(u64)(buf + (u64)i * chunk), chunk, !write};
		segs[i][2] = (struct vseg){(u64)&batch_status[i], 1, 1};
		chains[i] = (struct vchain){segs[i], 3, 0};
	}
	virtq_run_batch(d, q, chains, count, NULL);
	for (int i = 0; i < count; i++) {
		count_request(d, write ? T_OUT : T_IN, chunk, batch_status[i]);
		if (batch_status[i] != S_OK)
			fail("disk%d queue %d: batched %s %d of %d (%u bytes at 0x%lx) gave status %u",
			     d->index, q, write ? "write" : "read", i, count, chunk,
			     off + (u64)i * chunk, batch_status[i]);
	}
	kprintf("ok   disk%d q%d %-5s %-26s %6u bytes at 0x%06lx as %2d requests in flight\n",
		d->index, q, write ? "write" : "read", what, len, off, count);
}

static void fill_position(u8 *buf, u32 len, u64 off, int q)
{
	for (u32 s = 0; s < len; s += SECTOR)
		fill64(buf + s, POS_MAGIC | ((u64)q << 40) | (off + s), SECTOR);
}

static void check_position(struct vdev *d, int q, const u8 *buf, u32 len, u64 off)
{
	for (u32 s = 0; s < len; s += SECTOR) {
		u64 want = POS_MAGIC | ((u64)q << 40) | (off + s);
		i64 w = find_mismatch64(buf + s, want, SECTOR);
		if (w >= 0)
			fail("disk%d queue %d: sector at 0x%lx reads 0x%lx at byte %ld, want 0x%lx",
			     d->index, q, off + s, ((const u64 *)(buf + s))[w], w * 8, want);
	}
}

static void check_bytes(struct vdev *d, int q, const u8 *buf, u32 len, u64 off, u8 value,
			const char *what)
{
	i64 w = find_mismatch64(buf, BYTES8(value), len);
	if (w >= 0)
		fail("disk%d queue %d: %s at 0x%lx: byte 0x%lx reads 0x%lx, want bytes 0x%x",
		     d->index, q, what, off, w * 8, ((const u64 *)buf)[w], value);
	kprintf("ok   disk%d q%d check %-26s %6u bytes at 0x%06lx are 0x%02x\n", d->index, q, what,
		len, off, value);
}

static void range_command(struct vdev *d, int q, u32 type, u64 off, u32 len, u32 flags,
			  u32 max_sectors, const char *what)
{
	u64 sector = off / SECTOR;
	u32 left = len / SECTOR;
	int requests = 0;
	while (left) {
		u32 n = max_sectors && left > max_sectors ? max_sectors : left;
		range = (struct blk_range){sector, n, flags};
		struct vseg data = {(u64)&range, sizeof(range), 0};
		u8 s = blk_request(d, q, type, 0, &data, 1, 0);
		if (s != S_OK)
			fail("disk%d queue %d: %s of %u sectors at sector %lu gave status %u", d->index,
			     q, what, n, sector, s);
		sector += n;
		left -= n;
		requests++;
	}
	kprintf("ok   disk%d q%d %-32s %6u bytes at 0x%06lx in %d request(s)\n", d->index, q, what,
		len, off, requests);
}

static void flush(struct vdev *d, int q)
{
	if (!vdev_has(d, VIRTIO_BLK_F_FLUSH)) {
		kprintf("skip disk%d q%d flush: VIRTIO_BLK_F_FLUSH not offered\n", d->index, q);
		return;
	}
	u8 s = blk_request(d, q, T_FLUSH, 0, NULL, 0, 0);
	if (s != S_OK)
		fail("disk%d queue %d: flush gave status %u", d->index, q, s);
	kprintf("ok   disk%d q%d flush\n", d->index, q);
}

static void get_id(struct vdev *d, int q)
{
	memset(id_buf, 0, sizeof(id_buf));
	struct vseg data = {(u64)id_buf, 20, 1};
	u8 s = blk_request(d, q, T_GET_ID, 0, &data, 1, 0);
	if (s != S_OK)
		fail("disk%d queue %d: GET_ID gave status %u", d->index, q, s);
	for (int i = 0; i < 20 && id_buf[i]; i++) {
		if (id_buf[i] < 0x20 || id_buf[i] > 0x7E)
			id_buf[i] = '?';
	}
	kprintf("ok   disk%d q%d GET_ID serial \"%s\"\n", d->index, q, id_buf);
}

static void discard_check(struct vdev *d, int q, u64 base)
{
	u64 off = base + OFF_DISCARD;
	u32 align = d->cfg.discard_sector_alignment;
	if (!vdev_has(d, VIRTIO_BLK_F_DISCARD)) {
		kprintf("skip disk%d q%d discard: VIRTIO_BLK_F_DISCARD not offered\n", d->index, q);
		return;
	}
	if (align > 1 && ((off / SECTOR) % align || (BIG_LEN / SECTOR) % align)) {
		kprintf("skip disk%d q%d discard: alignment %u sectors\n", d->index, q, align);
		return;
	}
	fill64(wbuf, BYTES8(0xC0 + q), BIG_LEN);
	transfer(d, q, 1, off, wbuf, BIG_LEN, 0, BIG_LEN, "bytes 0xC0+q (to discard)");
	range_command(d, q, T_DISCARD, off, BIG_LEN, 0, d->cfg.max_discard_sectors, "discard");
}

static void write_zeroes_check(struct vdev *d, int q, u64 base)
{
	u64 off = base + OFF_ZERO;
	if (!vdev_has(d, VIRTIO_BLK_F_WRITE_ZEROES)) {
		kprintf("skip disk%d q%d write-zeroes: VIRTIO_BLK_F_WRITE_ZEROES not offered\n",
			d->index, q);
		return;
	}
	u32 max = d->cfg.max_write_zeroes_sectors;
	fill64(wbuf, BYTES8(0xE0 + q), BIG_LEN);
	transfer(d, q, 1, off, wbuf, BIG_LEN, 0, BIG_LEN, "bytes 0xE0+q (to zero)");
	range_command(d, q, T_WRITE_ZEROES, off, BIG_LEN / 2, 0, max, "write-zeroes");
	range_command(d, q, T_WRITE_ZEROES, off + BIG_LEN / 2, BIG_LEN / 2, WZ_FLAG_UNMAP, max,
		      "write-zeroes (unmap)");
	transfer(d, q, 0, off, rbuf, BIG_LEN, 0, 16384, "zeroed region");
	check_bytes(d, q, rbuf, BIG_LEN, off, 0, "zeroed region");
}

static void rw_checks(struct vdev *d, int q, u64 base)
{
	u64 big = base + OFF_BIG, small = base + OFF_SMALL;

	fill_position(wbuf, BIG_LEN, big, q);
	/* Through an indirect table when the device offers them (as Linux). */
	int indirect = vdev_has(d, VIRTIO_F_INDIRECT_DESC);
	transfer_ex(d, q, 1, big, wbuf, BIG_LEN, 0, 4096, "position pattern", indirect);
	transfer_ex(d, q, 0, big, rbuf, BIG_LEN, 512, 32768, "position pattern", indirect);
	check_position(d, q, rbuf, BIG_LEN, big);
	kprintf("ok   disk%d q%d check %-26s %6u bytes at 0x%06lx\n", d->index, q,
		"position pattern", BIG_LEN, big);

	batch_transfer(d, q, 0, big, rbuf, BIG_LEN, "position pattern");
	check_position(d, q, rbuf, BIG_LEN, big);
	kprintf("ok   disk%d q%d check %-26s %6u bytes at 0x%06lx\n", d->index, q,
		"position pattern (batch)", BIG_LEN, big);

	/* Over the position pattern, so a lost batched write shows. */
	fill64(wbuf, BYTES8(0x40 + q), BIG_LEN);
	batch_transfer(d, q, 1, big, wbuf, BIG_LEN, "bytes 0x40+q");
	transfer(d, q, 0, big, rbuf, BIG_LEN, 0, BIG_LEN, "bytes 0x40+q");
	check_bytes(d, q, rbuf, BIG_LEN, big, (u8)(0x40 + q), "bytes 0x40+q");

	/* 4 KiB from a buffer that starts mid-page, in two descriptors whose
	 * second one crosses a page boundary. */
	fill64(wbuf, BYTES8(0x80 + q), BIG_LEN + SMALL_LEN);
	transfer(d, q, 1, small, wbuf + 512, SMALL_LEN, 1536, 2560, "bytes 0x80+q");
	transfer(d, q, 0, small, rbuf, SMALL_LEN, 0, SMALL_LEN, "bytes 0x80+q");
	check_bytes(d, q, rbuf, SMALL_LEN, small, (u8)(0x80 + q), "bytes 0x80+q");

	flush(d, q);
	discard_check(d, q, base);
	write_zeroes_check(d, q, base);
	flush(d, q);

	/* Discard and write-zeroes must not have touched their neighbours:
	 * one 128 KiB read (32 x 4 KiB) over [B, B + 128 KiB). */
	transfer(d, q, 0, big, rbuf, HUGE_LEN, 0, 4096, "[B, B+128K) again");
	check_bytes(d, q, rbuf, BIG_LEN, big, (u8)(0x40 + q), "bytes 0x40+q again");
	check_bytes(d, q, rbuf + BIG_LEN, SMALL_LEN, small, (u8)(0x80 + q), "bytes 0x80+q again");
}

static void ro_checks(struct vdev *d, int q, u64 base)
{
	transfer(d, q, 0, base, rbuf, SMALL_LEN, 0, SMALL_LEN, "before refused write");
	memcpy(snapshot, rbuf, SMALL_LEN);
	fill64(wbuf, BYTES8(0x40 + q), SMALL_LEN);
	struct vseg data = {(u64)wbuf, SMALL_LEN, 0};
	u8 s = blk_request(d, q, T_OUT, base / SECTOR, &data, 1, 0);
	if (s != S_IOERR)
		fail("disk%d queue %d: write to a read-only disk gave status %u, want IOERR (1)",
		     d->index, q, s);
	kprintf("ok   disk%d q%d write to read-only disk refused with IOERR\n", d->index, q);
	transfer(d, q, 0, base, rbuf, SMALL_LEN, 0, SMALL_LEN, "after refused write");
	if (memcmp(snapshot, rbuf, SMALL_LEN) != 0)
		fail("disk%d queue %d: read-only disk changed at 0x%lx after a refused write",
		     d->index, q, base);
	kprintf("ok   disk%d q%d read-only data unchanged at 0x%06lx\n", d->index, q, base);
}

static void expect_status(struct vdev *d, int q, u32 type, u64 sector, u32 len, u8 want,
			  const char *what)
{
	struct vseg data = {(u64)rbuf, len, 1};
	u8 s = blk_request(d, q, type, sector, &data, 1, 0);
	if (s != want)
		fail("disk%d queue %d: %s gave status %u, want %u", d->index, q, what, s, want);
	kprintf("ok   disk%d q%d %s -> status %u\n", d->index, q, what, s);
}

static void test_queue(struct vdev *d, int q, u64 area)
{
	u64 base = (u64)q * REGION_STRIDE;
	get_id(d, q);
	if (base + REGION_STRIDE > area)
		kprintf("skip disk%d q%d data checks: region 0x%lx-0x%lx is beyond 0x%lx\n", d->index,
			q, base, base + REGION_STRIDE, area);
	else if (vdev_has(d, VIRTIO_BLK_F_RO))
		ro_checks(d, q, base);
	else
		rw_checks(d, q, base);

	u64 cap = d->cfg.capacity;
	expect_status(d, q, T_IN, cap, SECTOR, S_IOERR, "read at capacity");
	if (cap > 0)
		expect_status(d, q, T_IN, cap - 1, 2 * SECTOR, S_IOERR, "read across capacity");
	expect_status(d, q, T_UNKNOWN, 0, SECTOR, S_UNSUPP, "unknown request type");
}

/* Every queue with a data region reads the first 4 KiB of it, all queues
 * in flight at once (one kick each before any wait), into its own slice of
 * rbuf: exercises the per-queue workers and MSI-X vectors concurrently. */
static void all_queues_check(struct vdev *d, u64 area)
{
	struct vseg segs[VQ_MAX_QUEUES][3];
	int nq = 0;
	while (nq < d->num_queues && (u64)(nq + 1) * REGION_STRIDE <= area)
		nq++;
	if (nq < 2) {
		kprintf("skip disk%d all-queues check: fewer than 2 queues with a data region\n",
			d->index);
		return;
	}
	fill64(rbuf, POISON, (usize)nq * SMALL_LEN);
	for (int q = 0; q < nq; q++) {
		batch_hdr[q] = (struct blk_hdr){T_IN, 0, (u64)q * REGION_STRIDE / SECTOR};
		batch_status[q] = 0xFF;
		segs[q][0] = (struct vseg){(u64)&batch_hdr[q], sizeof(struct blk_hdr), 0};
		segs[q][1] = (struct vseg){(u64)(rbuf + (u64)q * SMALL_LEN), SMALL_LEN, 1};
		segs[q][2] = (struct vseg){(u64)&batch_status[q], 1, 1};
		struct vchain c = {segs[q], 3, 0};
		virtq_start(d, q, &c, 1);
	}
	for (int q = 0; q < nq; q++) {
		virtq_finish(d, q, NULL);
		count_request(d, T_IN, SMALL_LEN, batch_status[q]);
		if (batch_status[q] != S_OK)
			fail("disk%d queue %d: concurrent read gave status %u", d->index, q,
			     batch_status[q]);
	}
	for (int q = 0; !vdev_has(d, VIRTIO_BLK_F_RO) && q < nq; q++)
		check_bytes(d, q, rbuf + (u64)q * SMALL_LEN, SMALL_LEN, (u64)q * REGION_STRIDE,
			    (u8)(0x40 + q), "concurrent read");
	kprintf("ok   disk%d %d queues each had a read in flight at the same time\n", d->index, nq);
}

void blk_test_disk(struct vdev *d)
{
	u64 area = TEST_AREA;
	if (d->cfg.capacity < TEST_AREA / SECTOR)
		area = d->cfg.capacity * SECTOR;
	kprintf("info disk%d: %s, EVENT_IDX %s, indirect descriptors %s, testing %u queue(s) in "
		"the first 0x%lx bytes\n",
		d->index, vdev_has(d, VIRTIO_BLK_F_RO) ? "read-only" : "read-write",
		vdev_has(d, VIRTIO_F_RING_EVENT_IDX) ? "on" : "off",
		vdev_has(d, VIRTIO_F_INDIRECT_DESC) ? "on" : "off", d->num_queues, area);
	for (int q = 0; q < d->num_queues; q++)
		test_queue(d, q, area);
	all_queues_check(d, area);
	for (int q = 0; q < d->num_queues; q++)
		kprintf("ok   disk%d q%d %u batch(es), each completed with an interrupt on vector "
			"0x%x; %u kick(s) suppressed by EVENT_IDX\n",
			d->index, q, d->vq[q].interrupts, d->vq[q].cpu_vector,
			d->vq[q].kicks_suppressed);
}
