/*
 * console.c - the 8250 UART at I/O port 0x3F8 and a small printf.
 *
 * In:  format strings and values from the rest of the guest.
 * Out: bytes on COM1 (LSR bit 5 polled before each byte); fail() and pass()
 *      print the final RESULT line and end the run (machine_end.c).
 */
#include "common.h"
#include "machine_end.h"

#define COM1 0x3F8
#define UART_THR 0
#define UART_IER 1
#define UART_FCR 2
#define UART_LCR 3
#define UART_MCR 4
#define UART_LSR 5
#define LSR_THRE 0x20
/* A missing UART reads 0xFF (THRE set); this bound only guards a UART that
 * never drains. */
#define THRE_SPINS 100000

void console_init(void)
{
	outb(COM1 + UART_IER, 0x00);
	outb(COM1 + UART_LCR, 0x80); /* DLAB: divisor 1 = 115200 baud */
	outb(COM1 + 0, 0x01);
	outb(COM1 + 1, 0x00);
	outb(COM1 + UART_LCR, 0x03); /* 8N1 */
	outb(COM1 + UART_FCR, 0x07);
	outb(COM1 + UART_MCR, 0x03);
}

static void put_byte(char c)
{
	for (int i = 0; i < THRE_SPINS; i++) {
		if (inb(COM1 + UART_LSR) & LSR_THRE)
			break;
	}
	outb(COM1 + UART_THR, (u8)c);
}

static void put_str(const char *s)
{
	while (*s)
		put_byte(*s++);
}

static void put_num(u64 v, unsigned base, int width, char pad)
{
	char buf[24];
	int n = 0;
	do {
		unsigned d = (unsigned)(v % base);
		buf[n++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
		v /= base;
	} while (v && n < (int)sizeof(buf));
	while (n < width && n < (int)sizeof(buf))
		buf[n++] = pad;
	while (n)
		put_byte(buf[--n]);
}

/* Supports %s %c %d %u %x %p, a width (0-padded numbers, '-' left-aligned
 * strings) and the l modifier (64-bit). */
static void vprint(const char *fmt, __builtin_va_list ap)
{
	for (; *fmt; fmt++) {
		if (*fmt != '%') {
			put_byte(*fmt);
			continue;
		}
		fmt++;
		char pad = ' ';
		int width = 0, left = 0;
		if (*fmt == '-') {
			left = 1;
			fmt++;
		}
		if (*fmt == '0') {
			pad = '0';
			fmt++;
		}
		while (*fmt >= '0' && *fmt <= '9')
			width = width * 10 + (*fmt++ - '0');
		int is_long = 0;
		while (*fmt == 'l') {
			is_long = 1;
			fmt++;
		}
		switch (*fmt) {
		case 's': {
			const char *s = __builtin_va_arg(ap, const char *);
			if (!s)
				s = "(null)";
			int n = (int)strlen(s);
			for (int i = n; !left && i < width; i++)
				put_byte(' ');
			put_str(s);
			for (int i = n; left && i < width; i++)
				put_byte(' ');
			break;
		}
		case 'c':
			put_byte((char)__builtin_va_arg(ap, int));
			break;
		case 'd': {
			i64 v = is_long ? __builtin_va_arg(ap, i64) : __builtin_va_arg(ap, int);
			if (v < 0) {
				put_byte('-');
				v = -v;
			}
			put_num((u64)v, 10, width, pad);
			break;
		}
		case 'u':
			put_num(is_long ? __builtin_va_arg(ap, u64) : __builtin_va_arg(ap, u32), 10, width,
				pad);
			break;
		case 'x':
			put_num(is_long ? __builtin_va_arg(ap, u64) : __builtin_va_arg(ap, u32), 16, width,
				pad);
			break;
		case 'p':
			put_str("0x");
			put_num((u64)__builtin_va_arg(ap, void *), 16, width, pad);
			break;
		case '%':
			put_byte('%');
			break;
		case 0:
			return;
		default:
			put_byte('%');
			put_byte(*fmt);
			break;
		}
	}
}

void kprintf(const char *fmt, ...)
{
	__builtin_va_list ap;
	__builtin_va_start(ap, fmt);
	vprint(fmt, ap);
	__builtin_va_end(ap);
}

void fail(const char *fmt, ...)
{
	__builtin_va_list ap;
	cli();
	put_str("RESULT: FAIL ");
	__builtin_va_start(ap, fmt);
	vprint(fmt, ap);
	__builtin_va_end(ap);
	put_byte('\n');
	machine_end();
}

void pass(void)
{
	cli();
	put_str("RESULT: PASS\n");
	machine_end();
}
