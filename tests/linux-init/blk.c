/*
 * Pattern writes and read-back checks of disk regions with O_DIRECT
 * pread/pwrite (the guest's page cache is not in the way, so a check reads
 * what the device returns).
 */
#include "blk.h"
#include "pattern.h"

static const u64 request_sizes[] = { 4096, 512, 65536, 12288 };

struct io_result region_write(int fd, const struct region *r, u8 *buf)
{
	struct io_result res = { 0, 0, 0 };
	u64 done = 0;
	for (unsigned k = 0; done < r->len; k++) {
		u64 n = request_sizes[k % (sizeof(request_sizes) / sizeof(request_sizes[0]))];
		if (n > r->len - done)
			n = r->len - done;
		pattern_fill(buf, n, r->seed, r->off + done);
		i64 w = sys4(SYS_pwrite64, fd, buf, n, r->off + done);
		res.requests++;
		if (w != (i64)n) {
			res.err = w < 0 ? w : -5 /* EIO: short write */;
			return res;
		}
		done += n;
	}
	return res;
}

struct io_result region_check(int fd, const struct region *r, u8 *buf)
{
	struct io_result res = { 0, 0, 0 };
	for (u64 done = 0; done < r->len; done += IO_BUF) {
		u64 n = r->len - done < IO_BUF ? r->len - done : IO_BUF;
		i64 got = sys4(SYS_pread64, fd, buf, n, r->off + done);
		res.requests++;
		if (got != (i64)n) {
			res.err = got < 0 ? got : -5;
			return res;
		}
		res.mismatches += r->seed ? pattern_mismatches(buf, n, r->seed, r->off + done)
					  : zero_mismatches(buf, n);
	}
	return res;
}
