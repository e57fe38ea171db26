/*
 * bootinfo.c - reads the PVH struct hvm_start_info the VMM handed over in
 * %ebx: checks the magic, prints the command line and the memory map, checks
 * that the guest image lies in RAM, and parses the guest's own options.
 *
 * In:  the start_info physical address (untrusted VMM data: every count is
 *      bounded before use). Out: struct boot_options, console lines.
 */
#include "bootinfo.h"

#define HVM_START_MAGIC 0x336ec578
#define E820_RAM 1
#define MAX_MEMMAP_ENTRIES 128
#define MAX_CMDLINE 1024
/* Everything we touch must be below the identity map's end. */
#define MAPPED_LIMIT 0x100000000UL

struct hvm_start_info {
	u32 magic;
	u32 version;
	u32 flags;
	u32 nr_modules;
	u64 modlist_paddr;
	u64 cmdline_paddr;
	u64 rsdp_paddr;
	u64 memmap_paddr;
	u32 memmap_entries;
	u32 reserved;
};

struct hvm_memmap_entry {
	u64 addr;
	u64 size;
	u32 type;
	u32 reserved;
};

extern char __image_start[], __image_end[];

/* Whether the word s[0, n) equals the NUL-terminated string w. */
static int word_is(const char *s, usize n, const char *w)
{
	return strlen(w) == n && memcmp(s, w, n) == 0;
}

/* The decimal number s[0, n), with an optional k or m suffix (x1024,
 * x1048576) when `suffixes`; 0 when it is not one (or is over 2^31). */
static u64 parse_size(const char *s, usize n, int suffixes)
{
	u64 mult = 1;
	if (suffixes && n > 1 && (s[n - 1] == 'k' || s[n - 1] == 'K')) {
		mult = 1024;
		n--;
	} else if (suffixes && n > 1 && (s[n - 1] == 'm' || s[n - 1] == 'M')) {
		mult = 1024 * 1024;
		n--;
	}
	u64 v = 0;
	for (usize k = 0; k < n; k++) {
		if (s[k] < '0' || s[k] > '9' || v > (1UL << 31))
			return 0;
		v = v * 10 + (u64)(s[k] - '0');
	}
	v *= mult;
	return v > (1UL << 31) ? 0 : v;
}

/* Parses the guest's own options (space-separated words); other words are
 * ignored, bad values of our options fail the run. */
static void parse_cmdline(const char *s, usize len, struct boot_options *opt)
{
	usize i = 0;
	while (i < len) {
		while (i < len && s[i] == ' ')
			i++;
		usize j = i;
		while (j < len && s[j] != ' ')
			j++;
		const char *w = &s[i];
		usize n = j - i;
		if (n >= 6 && memcmp(w, "disks=", 6) == 0) {
			if (n > 8 || w[6] < '0' || w[6] > '9' || (n == 8 && (w[7] < '0' || w[7] > '9')))
				fail("bad guest option on cmdline (want disks=N, N < 100)");
			opt->expect_disks = (w[6] - '0') * (n == 8 ? 10 : 1) + (n == 8 ? w[7] - '0' : 0);
		} else if (word_is(w, n, "event_idx=on")) {
			opt->event_idx = 1;
		} else if (word_is(w, n, "event_idx=off")) {
			opt->event_idx = 0;
		} else if (n > 10 && memcmp(w, "event_idx=", 10) == 0) {
			fail("bad guest option on cmdline (want event_idx=on|off)");
		} else if (word_is(w, n, "indirect=on")) {
			opt->indirect = 1;
		} else if (word_is(w, n, "indirect=off")) {
			opt->indirect = 0;
		} else if (n > 9 && memcmp(w, "indirect=", 9) == 0) {
			fail("bad guest option on cmdline (want indirect=on|off)");
		} else if (word_is(w, n, "wait_resize")) {
			opt->wait_resize = 1;
		} else if (word_is(w, n, "wait_hotplug")) {
			opt->wait_hotplug = 1;
		} else if (word_is(w, n, "counts")) {
			opt->counts = 1;
		} else if (word_is(w, n, "rounds_all")) {
			opt->rounds_all = 1;
		} else if (word_is(w, n, "park")) {
			opt->park = 1;
		} else if (word_is(w, n, "wait_power_button")) {
			opt->wait_power_button = 1;
		} else if (word_is(w, n, "end=poweroff")) {
			opt->end = END_POWEROFF;
		} else if (word_is(w, n, "end=acpi-reset")) {
			opt->end = END_ACPI_RESET;
		} else if (word_is(w, n, "end=i8042")) {
			opt->end = END_I8042;
		} else if (word_is(w, n, "end=triple")) {
			opt->end = END_TRIPLE;
		} else if (n >= 4 && memcmp(w, "end=", 4) == 0) {
			fail("bad guest option on cmdline (want end=poweroff|acpi-reset|i8042|triple)");
		} else if (n > 10 && memcmp(w, "io_rounds=", 10) == 0) {
			int v = 0;
			for (usize k = 10; k < n; k++) {
				if (w[k] < '0' || w[k] > '9' || v > 99)
					fail("bad guest option on cmdline (want io_rounds=N, N < 1000)");
				v = v * 10 + (w[k] - '0');
			}
			opt->io_rounds = v;
		} else if (n > 5 && memcmp(w, "load=", 5) == 0) {
			u64 v = parse_size(w + 5, n - 5, 0);
			if (v < 1 || v > LOAD_MAX_SECONDS)
				fail("bad guest option on cmdline (want load=SECONDS, 1..%d)",
				     LOAD_MAX_SECONDS);
			opt->load_seconds = (int)v;
		} else if (n > 6 && memcmp(w, "depth=", 6) == 0) {
			u64 v = parse_size(w + 6, n - 6, 0);
			if (v < 1 || v > LOAD_MAX_DEPTH)
				fail("bad guest option on cmdline (want depth=N, 1..%d)", LOAD_MAX_DEPTH);
			opt->load_depth = (int)v;
		} else if (n > 3 && memcmp(w, "bs=", 3) == 0) {
			u64 v = parse_size(w + 3, n - 3, 1);
			if (v < 512 || v > LOAD_MAX_BS || v % 512)
				fail("bad guest option on cmdline (want bs=BYTES, a multiple of 512 up to "
				     "1m; k and m suffixes)");
			opt->load_bs = (u32)v;
		} else if (n > 3 && memcmp(w, "rw=", 3) == 0) {
			if (word_is(w, n, "rw=randread"))
				opt->load_rw = LOAD_RANDREAD;
			else if (word_is(w, n, "rw=randwrite"))
				opt->load_rw = LOAD_RANDWRITE;
			else if (word_is(w, n, "rw=read"))
				opt->load_rw = LOAD_READ;
			else if (word_is(w, n, "rw=write"))
				opt->load_rw = LOAD_WRITE;
			else
				fail("bad guest option on cmdline (want rw=randread|randwrite|read|write)");
		}
		i = j;
	}
}

static void read_cmdline(u64 paddr, struct boot_options *opt)
{
	if (paddr == 0) {
		kprintf("info cmdline: (none)\n");
		return;
	}
	if (paddr >= MAPPED_LIMIT - MAX_CMDLINE)
		fail("cmdline_paddr 0x%lx is outside the mapped 4 GiB", paddr);
	const char *s = (const char *)paddr;
	usize len = 0;
	while (len < MAX_CMDLINE && s[len])
		len++;
	if (len == MAX_CMDLINE)
		fail("cmdline is not NUL-terminated within %d bytes", MAX_CMDLINE);
	kprintf("info cmdline: \"%s\"\n", s);
	parse_cmdline(s, len, opt);
}

static void read_memmap(const struct hvm_start_info *si)
{
	if (si->version < 1 || si->memmap_paddr == 0 || si->memmap_entries == 0) {
		kprintf("info memmap: none (start_info version %u)\n", si->version);
		return;
	}
	u32 n = si->memmap_entries;
	if (n > MAX_MEMMAP_ENTRIES)
		fail("memmap has %u entries (more than %d)", n, MAX_MEMMAP_ENTRIES);
	if (si->memmap_paddr >= MAPPED_LIMIT - n * sizeof(struct hvm_memmap_entry))
		fail("memmap_paddr 0x%lx is outside the mapped 4 GiB", si->memmap_paddr);
	const struct hvm_memmap_entry *e = (const struct hvm_memmap_entry *)si->memmap_paddr;
	u64 img_lo = (u64)__image_start, img_hi = (u64)__image_end;
	int image_in_ram = 0;
	for (u32 i = 0; i < n; i++) {
		kprintf("info memmap[%u]: 0x%lx-0x%lx type %u\n", i, e[i].addr,
			e[i].addr + e[i].size, e[i].type);
		if (e[i].type == E820_RAM && e[i].addr <= img_lo && e[i].size >= img_hi - e[i].addr)
			image_in_ram = 1;
	}
	if (!image_in_ram)
		fail("memmap has no RAM entry covering the guest image 0x%lx-0x%lx", img_lo,
		     img_hi);
	kprintf("ok   memmap covers the guest image 0x%lx-0x%lx\n", img_lo, img_hi);
}

void bootinfo_read(u64 start_info_paddr, struct boot_options *opt)
{
	opt->expect_disks = -1;
	opt->event_idx = 1;
	opt->indirect = 1;
	opt->wait_resize = opt->wait_hotplug = opt->io_rounds = opt->counts = opt->park = 0;
	opt->rounds_all = 0;
	opt->wait_power_button = 0;
	opt->end = END_POWEROFF;
	opt->load_seconds = 0;
	opt->load_depth = 1;
	opt->load_bs = 4096;
	opt->load_rw = LOAD_RANDREAD;
	if (start_info_paddr == 0 || start_info_paddr >= MAPPED_LIMIT - sizeof(struct hvm_start_info))
		fail("bad start_info address 0x%lx in %%ebx", start_info_paddr);
	const struct hvm_start_info *si = (const struct hvm_start_info *)start_info_paddr;
	if (si->magic != HVM_START_MAGIC)
		fail("hvm_start_info magic is 0x%x, want 0x%x", si->magic, HVM_START_MAGIC);
	kprintf("ok   hvm_start_info at 0x%lx, version %u\n", start_info_paddr, si->version);
	/* From here a failure can power off (the tables are found lazily). */
	machine_end_setup(si->rsdp_paddr, END_POWEROFF);
	read_cmdline(si->cmdline_paddr, opt);
	machine_end_setup(si->rsdp_paddr, opt->end);
	read_memmap(si);
}
