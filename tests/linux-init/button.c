/*
 * The ACPI power button, as the guest's init sees it (chtest.power_button=1):
 * Linux's ACPI button driver turns the firmware's notify on \_SB.PWRB (the
 * VMM's vm.power-button) into a KEY_POWER press on an input device named
 * "Power Button"; init waits for that press on the device's evdev node
 * before it powers off, as a desktop's power daemon would.
 *
 * In:  sysfs (/sys/class/input/eventN/device/name) and /dev/input/eventN.
 * Out: 0 once the press is read, or -errno (no such device, a read error).
 */
#include "button.h"

#define EV_KEY 1
#define KEY_POWER 116
#define MAX_EVENT_NODES 8

/* struct input_event on x86-64: a timeval, then type, code, value. */
struct input_event {
	i64 sec;
	i64 usec;
	unsigned short type;
	unsigned short code;
	int value;
};

static char name[128];

/* Whether input device N is the ACPI power button. */
static int is_power_button(int n)
{
	char path[] = "/sys/class/input/event0/device/name";
	path[sizeof("/sys/class/input/event") - 1] = (char)('0' + n);
	i64 fd = sys4(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	i64 len = sys3(SYS_read, fd, name, sizeof(name) - 1);
	sys1(SYS_close, fd);
	if (len <= 0)
		return 0;
	name[len] = 0;
	return str_starts(name, "Power Button");
}

i64 wait_power_button(void)
{
	int n = 0;
	while (n < MAX_EVENT_NODES && !is_power_button(n))
		n++;
	if (n == MAX_EVENT_NODES)
		return -ENOENT;
	char dev[] = "/dev/input/event0";
	dev[sizeof(dev) - 2] = (char)('0' + n);
	i64 fd = sys4(SYS_openat, AT_FDCWD, dev, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return fd;
	struct input_event ev;
	for (;;) {
		i64 r = sys3(SYS_read, fd, &ev, sizeof(ev));
		if (r < 0) {
			sys1(SYS_close, fd);
			return r;
		}
		if (r == (i64)sizeof(ev) && ev.type == EV_KEY && ev.code == KEY_POWER && ev.value == 1)
			break;
	}
	sys1(SYS_close, fd);
	return 0;
}
