/*
 * /init of the Linux guest that boots under our cloud-hypervisor on every
 * CI run (scripts/run-linux-guest.sh, docs/linux-guests.md). A static
 * program with raw system calls and no SSE: it mounts devtmpfs, proc and
 * sysfs, finds the queues Linux made for /dev/vda, writes and verifies
 * patterns with O_DIRECT from one thread per queue (each pinned to a CPU
 * the queue serves), then fdatasync, BLKZEROOUT, BLKDISCARD and a final
 * read-back; one line per check on the console:
 *
 *     CHTEST result name=NAME status=ok|fail KEY=VALUE...
 *     CHTEST done failures=N
 *
 * then powers off with reboot(2). Parameters come from /proc/cmdline:
 * chtest.queues=N, the number of queues vda must have (default 1);
 * chtest.power_button=1, wait for the ACPI power button before powering
 * off (button.c), printing
 *
 *     CHTEST waiting for the power button
 *     CHTEST power button pressed
 *
 *
 * Disk layout (the host builds the expected image from the same table):
 *   queue q's region:  (4 + q) MiB, 256 KiB, seed 0x100 + q
 *   BLKZEROOUT region: 16 MiB, 1 MiB (written with seed 0x200, then zeroed)
 *   BLKDISCARD region: 20 MiB, 1 MiB with seed 0x300; its first 512 KiB
 *                      discarded, then rewritten with seed 0x301
 */
#include "blk.h"
#include "button.h"
#include "sys.h"
#include "thread.h"

#define MIB (1UL << 20)

static u8 io_bufs[MAX_THREADS + 1][IO_BUF] __attribute__((aligned(4096)));
static char text[16384];
static int failures;

struct queue_job {
	int queue;
	int cpu;       /* the CPU the thread pins itself to */
	int fd;
	int cpu_seen;  /* where it ran */
	i64 pin_err;
	struct region region;
	struct io_result write, check;
	i64 ms;
};

static void result(struct line *l, const char *name, int ok)
{
	struct line head = { .len = 0 };
	line_str(&head, "CHTEST result name=");
	line_str(&head, name);
	line_str(&head, ok ? " status=ok" : " status=fail");
	if (l->len) {
		l->buf[l->len] = 0;
		line_str(&head, " ");
		line_str(&head, l->buf[0] == ' ' ? l->buf + 1 : l->buf);
	}
	line_put(&head);
	l->len = 0;
	if (!ok)
		failures++;
}

static void say(const char *s)
{
	struct line l = { .len = 0 };
	line_str(&l, s);
	line_put(&l);
}

/* Reads a small file into `text`; returns its length or -errno. */
static i64 read_file(const char *path)
{
	i64 fd = sys4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return fd;
	i64 n = 0, r;
	while ((r = sys3(SYS_read, fd, text + n, sizeof(text) - 1 - n)) > 0)
		n += r;
	sys1(SYS_close, fd);
	text[n] = 0;
	return r < 0 ? r : n;
}

static u64 parse_u64(const char **p)
{
	u64 v = 0;
	while (**p >= '0' && **p <= '9')
		v = v * 10 + (u64)(*(*p)++ - '0');
	return v;
}

/* The value of `key=` on the kernel command line, or `def`. */
static u64 cmdline_u64(const char *key, u64 def)
{
	if (read_file("/proc/cmdline") < 0)
		return def;
	size_t k = strlen(key);
	for (const char *p = text; *p; p++) {
		if ((p == text || p[-1] == ' ') && str_starts(p, key) && p[k] == '=') {
			const char *v = p + k + 1;
			return parse_u64(&v);
		}
	}
	return def;
}

static void mount_all(void)
{
	sys2(SYS_mkdir, "/dev", 0755);
	sys2(SYS_mkdir, "/proc", 0555);
	sys2(SYS_mkdir, "/sys", 0555);
	sys5(SYS_mount, "devtmpfs", "/dev", "devtmpfs", 0, 0);
	/* The kernel found no /dev/console in the initramfs: open it now. */
	i64 fd = sys4(SYS_openat, AT_FDCWD, "/dev/console", O_RDWR, 0);
	if (fd >= 0) {
		for (int i = 0; i < 3; i++)
			if (fd != i)
				sys3(292 /* dup3 */, fd, i, 0);
	}
	sys5(SYS_mount, "proc", "/proc", "proc", 0, 0);
	sys5(SYS_mount, "sysfs", "/sys", "sysfs", 0, 0);
}

static void banner(void)
{
	/* struct utsname: six 65-byte fields. */
	char uts[6 * 65];
	struct line l = { .len = 0 };
	line_str(&l, "CHTEST init: ");
	if (sys1(SYS_uname, uts) == 0) {
		line_str(&l, uts);
		line_str(&l, " ");
		line_str(&l, uts + 2 * 65);
		line_str(&l, " ");
		line_str(&l, uts + 3 * 65);
	}
	line_put(&l);
}

/* Waits up to 30 s for /dev/vda (devtmpfs creates it when the disk probes). */
static i64 open_vda(void)
{
	i64 fd = -ENOENT;
	for (int i = 0; i < 300; i++) {
		fd = sys4(SYS_openat, AT_FDCWD, "/dev/vda", O_RDWR | O_DIRECT | O_CLOEXEC, 0);
		if (fd != -ENOENT)
			break;
		sleep_ms(100);
	}
	return fd;
}

/* The queues in /sys/block/vda/mq and, for each, the first CPU it serves. */
static int find_queues(int *first_cpu, struct line *l)
{
	struct dirent64 {
		u64 ino;
		i64 off;
		unsigned short reclen;
		u8 type;
		char name[];
	};
	static char dents[4096] __attribute__((aligned(8)));
	i64 dir = sys4(SYS_openat, AT_FDCWD, "/sys/block/vda/mq", O_RDONLY | O_DIRECTORY, 0);
	if (dir < 0)
		return 0;
	int count = 0;
	i64 n;
	while ((n = sys3(SYS_getdents64, dir, dents, sizeof(dents))) > 0) {
		for (i64 at = 0; at < n;) {
			struct dirent64 *d = (struct dirent64 *)(dents + at);
			at += d->reclen;
			if (d->name[0] < '0' || d->name[0] > '9')
				continue;
			const char *p = d->name;
			u64 q = parse_u64(&p);
			char path[64] = "/sys/block/vda/mq/";
			size_t len = strlen(path);
			memcpy(path + len, d->name, strlen(d->name));
			memcpy(path + len + strlen(d->name), "/cpu_list", 10);
			int cpu = -1;
			if (read_file(path) > 0) {
				const char *c = text;
				cpu = (int)parse_u64(&c);
				for (size_t i = 0; text[i]; i++)
					if (text[i] == '\n')
						text[i] = 0;
			}
			if (q < MAX_THREADS)
				first_cpu[q] = cpu;
			line_str(l, " q");
			line_u64(l, q);
			line_str(l, "_cpus=");
			line_str(l, cpu >= 0 ? text : "?");
			count++;
		}
	}
	sys1(SYS_close, dir);
	return count;
}

static void queue_worker(void *arg)
{
	struct queue_job *job = arg;
	i64 t0 = now_ms();
	job->pin_err = pin_to_cpu(job->cpu);
	job->cpu_seen = current_cpu();
	u8 *buf = io_bufs[job->queue];
	job->write = region_write(job->fd, &job->region, buf);
	if (!job->write.err)
		job->check = region_check(job->fd, &job->region, buf);
	job->ms = now_ms() - t0;
}

static void io_fields(struct line *l, const char *what, const struct io_result *r)
{
	line_str(l, " ");
	line_str(l, what);
	line_str(l, "_requests=");
	line_u64(l, r->requests);
	if (r->err) {
		line_str(l, " ");
		line_str(l, what);
		line_str(l, "_errno=");
		line_u64(l, (u64)-r->err);
	}
	if (r->mismatches) {
		line_str(l, " ");
		line_str(l, what);
		line_str(l, "_bad_words=");
		line_u64(l, r->mismatches);
	}
}

static int io_ok(const struct io_result *r)
{
	return r->err == 0 && r->mismatches == 0;
}

/* Interrupts per vda request queue ("virtioN-req.Q") from /proc/interrupts. */
static void count_irqs(u64 *per_queue, int queues)
{
	if (read_file("/proc/interrupts") < 0)
		return;
	for (char *line = text; *line;) {
		char *end = line;
		while (*end && *end != '\n')
			end++;
		char *req = 0;
		for (char *p = line; p + 5 <= end; p++)
			if (str_starts(p, "-req."))
				req = p + 5;
		if (req) {
			const char *q = req;
			u64 queue = parse_u64(&q);
			const char *p = line;
			while (p < end && *p != ':')
				p++;
			u64 sum = 0;
			for (p++; p < end;) {
				while (p < end && *p == ' ')
					p++;
				if (p >= end || *p < '0' || *p > '9')
					break;
				sum += parse_u64(&p);
			}
			if (queue < (u64)queues)
				per_queue[queue] += sum;
		}
		line = *end ? end + 1 : end;
	}
}

static void power_off(void)
{
	sys0(SYS_sync);
	sys4(SYS_reboot, LINUX_REBOOT_MAGIC1, LINUX_REBOOT_MAGIC2, LINUX_REBOOT_CMD_POWER_OFF, 0);
	say("CHTEST init: reboot(POWER_OFF) returned");
	for (;;)
		sleep_ms(1000);
}

int main(void)
{
	mount_all();
	banner();
	i64 t0 = now_ms();
	struct line l = { .len = 0 };
	u64 want_queues = cmdline_u64("chtest.queues", 1);

	i64 fd = open_vda();
	if (fd < 0) {
		line_str(&l, "errno=");
		line_u64(&l, (u64)-fd);
		result(&l, "open", 0);
		goto done;
	}
	u64 size = 0;
	sys3(SYS_ioctl, fd, BLKGETSIZE64, &size);

	int first_cpu[MAX_THREADS];
	for (int i = 0; i < MAX_THREADS; i++)
		first_cpu[i] = -1;
	struct line cpus = { .len = 0 };
	int queues = find_queues(first_cpu, &cpus);
	line_str(&l, "count=");
	line_u64(&l, (u64)queues);
	line_str(&l, " want=");
	line_u64(&l, want_queues);
	line_str(&l, " size=");
	line_u64(&l, size);
	cpus.buf[cpus.len] = 0;
	line_str(&l, cpus.buf);
	int queues_ok = queues == (int)want_queues && queues <= MAX_THREADS && size >= 24 * MIB;
	for (int q = 0; q < queues && q < MAX_THREADS; q++)
		queues_ok &= first_cpu[q] >= 0;
	result(&l, "queues", queues_ok);
	if (!queues_ok)
		goto done;

	/* One thread per queue, each pinned to a CPU that queue serves. */
	struct queue_job jobs[MAX_THREADS];
	struct thread threads[MAX_THREADS];
	for (int q = 0; q < queues; q++) {
		jobs[q] = (struct queue_job){
			.queue = q,
			.cpu = first_cpu[q],
			.fd = (int)fd,
			.cpu_seen = -1,
			.region = { (4 + (u64)q) * MIB, 256 * 1024, 0x100 + (u64)q },
		};
		if (thread_start(&threads[q], q, queue_worker, &jobs[q]) < 0) {
			say("CHTEST init: clone failed");
			threads[q].tid_word = 0;
		}
	}
	for (int q = 0; q < queues; q++)
		thread_join(&threads[q]);
	for (int q = 0; q < queues; q++) {
		struct queue_job *j = &jobs[q];
		line_str(&l, "cpu=");
		line_u64(&l, (u64)j->cpu);
		line_str(&l, " ran_on=");
		line_u64(&l, (u64)j->cpu_seen);
		line_str(&l, " bytes=");
		line_u64(&l, j->region.len);
		io_fields(&l, "write", &j->write);
		io_fields(&l, "check", &j->check);
		line_str(&l, " ms=");
		line_u64(&l, (u64)j->ms);
		char name[] = "write-verify-q0";
		name[sizeof(name) - 2] = (char)('0' + q);
		result(&l, name,
		       j->pin_err == 0 && j->cpu_seen == j->cpu && io_ok(&j->write) && j->check.requests &&
			       io_ok(&j->check));
	}

	i64 rc = sys1(SYS_fdatasync, fd);
	line_str(&l, "rc=");
	line_u64(&l, (u64)(rc < 0 ? -rc : rc));
	result(&l, "fdatasync", rc == 0);

	u64 irqs[MAX_THREADS] = { 0 };
	count_irqs(irqs, queues);
	int irqs_ok = 1;
	for (int q = 0; q < queues; q++) {
		line_str(&l, q ? " q" : "q");
		line_u64(&l, (u64)q);
		line_str(&l, "=");
		line_u64(&l, irqs[q]);
		irqs_ok &= irqs[q] > 0;
	}
	result(&l, "irqs", irqs_ok);

	u8 *buf = io_bufs[MAX_THREADS];
	/* BLKZEROOUT: written, zeroed, must read back as zeroes. */
	struct region zero_written = { 16 * MIB, MIB, 0x200 };
	struct region zeroed = { 16 * MIB, MIB, 0 };
	struct io_result w = region_write((int)fd, &zero_written, buf);
	u64 range[2] = { zeroed.off, zeroed.len };
	rc = sys3(SYS_ioctl, fd, BLKZEROOUT, range);
	struct io_result c = region_check((int)fd, &zeroed, buf);
	io_fields(&l, "write", &w);
	line_str(&l, " ioctl_rc=");
	line_u64(&l, (u64)(rc < 0 ? -rc : rc));
	io_fields(&l, "check", &c);
	result(&l, "zeroout", io_ok(&w) && rc == 0 && io_ok(&c));

	/* BLKDISCARD: must succeed; whether the range then reads as zeroes is
	 * the device's choice (reported). The range is written again after. */
	struct region discard_all = { 20 * MIB, MIB, 0x300 };
	struct region discarded = { 20 * MIB, MIB / 2, 0 };
	struct region rewritten = { 20 * MIB, MIB / 2, 0x301 };
	struct region kept = { 20 * MIB + MIB / 2, MIB / 2, 0x300 };
	w = region_write((int)fd, &discard_all, buf);
	range[0] = discarded.off;
	range[1] = discarded.len;
	rc = sys3(SYS_ioctl, fd, BLKDISCARD, range);
	c = region_check((int)fd, &discarded, buf);
	line_str(&l, "ioctl_rc=");
	line_u64(&l, (u64)(rc < 0 ? -rc : rc));
	line_str(&l, c.err == 0 && c.mismatches == 0 ? " reads_zero=yes" : " reads_zero=no");
	struct io_result w2 = region_write((int)fd, &rewritten, buf);
	struct io_result c1 = region_check((int)fd, &rewritten, buf);
	struct io_result c2 = region_check((int)fd, &kept, buf);
	io_fields(&l, "write", &w);
	io_fields(&l, "rewrite", &w2);
	io_fields(&l, "check_rewritten", &c1);
	io_fields(&l, "check_kept", &c2);
	result(&l, "discard", io_ok(&w) && rc == 0 && c.err == 0 && io_ok(&w2) && io_ok(&c1) && io_ok(&c2));

	rc = sys1(SYS_fdatasync, fd);
	/* Everything once more, as the image must now hold it. */
	u64 bad = 0, errs = 0;
	for (int q = 0; q < queues; q++) {
		c = region_check((int)fd, &jobs[q].region, buf);
		bad += c.mismatches;
		errs += c.err != 0;
	}
	const struct region *final[] = { &zeroed, &rewritten, &kept };
	for (unsigned i = 0; i < 3; i++) {
		c = region_check((int)fd, final[i], buf);
		bad += c.mismatches;
		errs += c.err != 0;
	}
	line_str(&l, "fdatasync_rc=");
	line_u64(&l, (u64)(rc < 0 ? -rc : rc));
	line_str(&l, " bad_words=");
	line_u64(&l, bad);
	line_str(&l, " errors=");
	line_u64(&l, errs);
	result(&l, "readback", rc == 0 && bad == 0 && errs == 0);
	sys1(SYS_close, fd);

done:
	line_str(&l, "CHTEST done failures=");
	line_u64(&l, (u64)failures);
	line_str(&l, " init_ms=");
	line_u64(&l, (u64)(now_ms() - t0));
	line_put(&l);
	if (cmdline_u64("chtest.power_button", 0)) {
		say("CHTEST waiting for the power button");
		i64 rc = wait_power_button();
		if (rc < 0) {
			line_str(&l, "CHTEST power button: errno=");
			line_u64(&l, (u64)-rc);
			line_put(&l);
		} else {
			say("CHTEST power button pressed");
		}
	}
	power_off();
	return 0;
}
