/*
 * Raw Linux x86-64 system calls, constants and a few string helpers for
 * the guest's init (no C library: the program must run without SSE, and
 * a libc would bring SSE string functions; see docs/linux-guests.md).
 */
#ifndef LINUX_INIT_SYS_H
#define LINUX_INIT_SYS_H

typedef unsigned long u64;
typedef long i64;
typedef unsigned int u32;
typedef unsigned char u8;
typedef unsigned long size_t;

#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_nanosleep 35
#define SYS_ioctl 16
#define SYS_pread64 17
#define SYS_pwrite64 18
#define SYS_clone 56
#define SYS_exit 60
#define SYS_uname 63
#define SYS_fdatasync 75
#define SYS_mkdir 83
#define SYS_sync 162
#define SYS_mount 165
#define SYS_reboot 169
#define SYS_futex 202
#define SYS_sched_setaffinity 203
#define SYS_getdents64 217
#define SYS_clock_gettime 228
#define SYS_exit_group 231
#define SYS_openat 257
#define SYS_getcpu 309

#define AT_FDCWD (-100)
#define O_RDONLY 0
#define O_RDWR 2
#define O_DIRECTORY 0200000
#define O_DIRECT 040000
#define O_CLOEXEC 02000000
#define ENOENT 2

#define CLONE_VM 0x100
#define CLONE_FS 0x200
#define CLONE_FILES 0x400
#define CLONE_SIGHAND 0x800
#define CLONE_THREAD 0x10000
#define CLONE_SYSVSEM 0x40000
#define CLONE_CHILD_CLEARTID 0x200000
#define FUTEX_WAIT 0

#define BLKGETSIZE64 0x80081272UL
#define BLKDISCARD 0x1277UL
#define BLKZEROOUT 0x127fUL

#define LINUX_REBOOT_MAGIC1 0xfee1deadUL
#define LINUX_REBOOT_MAGIC2 672274793UL
#define LINUX_REBOOT_CMD_POWER_OFF 0x4321fedcUL

static inline i64 sys6(i64 n, i64 a, i64 b, i64 c, i64 d, i64 e, i64 f)
{
	i64 ret;
	register i64 r10 __asm__("r10") = d;
	register i64 r8 __asm__("r8") = e;
	register i64 r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

#define sys0(n) sys6((n), 0, 0, 0, 0, 0, 0)
#define sys1(n, a) sys6((n), (i64)(a), 0, 0, 0, 0, 0)
#define sys2(n, a, b) sys6((n), (i64)(a), (i64)(b), 0, 0, 0, 0)
#define sys3(n, a, b, c) sys6((n), (i64)(a), (i64)(b), (i64)(c), 0, 0, 0)
#define sys4(n, a, b, c, d) sys6((n), (i64)(a), (i64)(b), (i64)(c), (i64)(d), 0, 0)
#define sys5(n, a, b, c, d, e) sys6((n), (i64)(a), (i64)(b), (i64)(c), (i64)(d), (i64)(e), 0)

struct timespec {
	i64 tv_sec;
	i64 tv_nsec;
};

/* gcc may emit calls to these for struct copies and zeroing. */
void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
size_t strlen(const char *s);
int str_starts(const char *s, const char *prefix);

/* A line being built, written with one write(2) so lines never mix. */
struct line {
	char buf[512];
	size_t len;
};

void line_str(struct line *l, const char *s);
void line_u64(struct line *l, u64 v);
void line_hex(struct line *l, u64 v);
void line_put(struct line *l);

i64 now_ms(void);
void sleep_ms(i64 ms);

#endif
