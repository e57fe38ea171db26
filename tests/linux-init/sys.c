/*
 * The program's entry point and the helpers every part uses: string
 * functions gcc may call, console lines, clocks.
 */
#include "sys.h"

int main(void);

__asm__(".globl _start\n"
	"_start:\n"
	"	xor %rbp, %rbp\n"
	"	and $-16, %rsp\n"
	"	call main\n"
	"	mov %eax, %edi\n"
	"	mov $231, %eax\n" /* exit_group */
	"	syscall\n"
	"	hlt\n");

void *memset(void *dst, int c, size_t n)
{
	u8 *d = dst;
	while (n--)
		*d++ = (u8)c;
	return dst;
}

void *memcpy(void *dst, const void *src, size_t n)
{
	u8 *d = dst;
	const u8 *s = src;
	while (n--)
		*d++ = *s++;
	return dst;
}

size_t strlen(const char *s)
{
	size_t n = 0;
	while (s[n])
		n++;
	return n;
}

int str_starts(const char *s, const char *prefix)
{
	while (*prefix)
		if (*s++ != *prefix++)
			return 0;
	return 1;
}

void line_str(struct line *l, const char *s)
{
	while (*s && l->len < sizeof(l->buf) - 1)
		l->buf[l->len++] = *s++;
}

void line_u64(struct line *l, u64 v)
{
	char tmp[24];
	int n = 0;
	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n && l->len < sizeof(l->buf) - 1)
		l->buf[l->len++] = tmp[--n];
}

void line_hex(struct line *l, u64 v)
{
	char tmp[16];
	int n = 0;
	do {
		tmp[n++] = "0123456789abcdef"[v & 15];
		v >>= 4;
	} while (v);
	line_str(l, "0x");
	while (n && l->len < sizeof(l->buf) - 1)
		l->buf[l->len++] = tmp[--n];
}

/* Writes the line and a newline to stdout (the console), then empties it. */
void line_put(struct line *l)
{
	l->buf[l->len++] = '\n';
	sys3(SYS_write, 1, l->buf, l->len);
	l->len = 0;
}

i64 now_ms(void)
{
	struct timespec ts;
	sys2(SYS_clock_gettime, 1 /* CLOCK_MONOTONIC */, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(i64 ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };
	sys2(SYS_nanosleep, &ts, 0);
}
