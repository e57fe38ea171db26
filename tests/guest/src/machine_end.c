/*
 * machine_end.c - how a run ends. By default the guest powers the machine
 * off as an ACPI OS does: SLP_TYP 5 (the \_S5 of both Cloud Hypervisors'
 * DSDTs) with SLP_EN, written to the FADT's sleep control register; a VMM
 * ends on it. `end=` on the command line asks for a reset instead, which
 * a VMM answers with a reboot (the guest then runs again):
 *
 *   end=poweroff    the default (above)
 *   end=acpi-reset  the FADT's reset register and value (RESET_REG)
 *   end=i8042       0xFE to the i8042 command port 0x64
 *   end=triple      an exception with an empty IDT: a triple fault
 *
 * When the way asked for does nothing (no ACPI tables, or a VMM that
 * ignores it: QEMU's q35 has no sleep control register), the guest falls
 * back to the i8042 reset, then a triple fault, as it always did.
 *
 * In:  the RSDP address from start_info (untrusted: every table is
 *      bounded and checked before use), the end= option. Out: the VM
 *      ends or resets; nothing returns.
 */
#include "machine_end.h"

#define MAPPED_LIMIT 0x100000000UL
#define SLP_TYP_S5 5u
#define SLP_EN (1u << 5)
#define GAS_SYSTEM_IO 1
/* FADT offsets (ACPI 6.5, table 5.9). */
#define FADT_RESET_REG 116
#define FADT_RESET_VALUE 128
#define FADT_SLEEP_CONTROL_REG 244
#define FADT_MIN_LEN_RESET 129
#define FADT_MIN_LEN_SLEEP 256

static u64 rsdp_paddr;
static enum end_mode end_mode;

void triple_fault(void) __attribute__((noreturn));

void machine_end_setup(u64 rsdp, enum end_mode mode)
{
	rsdp_paddr = rsdp;
	end_mode = mode;
}

static int in_map(u64 addr, u64 len)
{
	return addr != 0 && addr < MAPPED_LIMIT && len < MAPPED_LIMIT - addr;
}

/* The FADT through the RSDP and XSDT (or RSDT); NULL when there is none
 * or a table is out of bounds. Its length goes to *len. */
static const u8 *find_fadt(u32 *len)
{
	if (!in_map(rsdp_paddr, 36))
		return NULL;
	const u8 *rsdp = (const u8 *)rsdp_paddr;
	if (memcmp(rsdp, "RSD PTR ", 8) != 0)
		return NULL;
	u64 sdt;
	usize entry = 4;
	if (rsdp[15] >= 2 && *(const u64 *)(rsdp + 24) != 0) {
		sdt = *(const u64 *)(rsdp + 24);
		entry = 8;
	} else {
		sdt = *(const u32 *)(rsdp + 16);
	}
	if (!in_map(sdt, 36))
		return NULL;
	u32 sdt_len = *(const u32 *)(sdt + 4);
	if (sdt_len < 36 || sdt_len > 4096 || !in_map(sdt, sdt_len))
		return NULL;
	for (u32 off = 36; off + entry <= sdt_len; off += entry) {
		u64 t = entry == 8 ? *(const u64 *)(sdt + off) : *(const u32 *)(sdt + off);
		if (!in_map(t, 36) || memcmp((const void *)t, "FACP", 4) != 0)
			continue;
		*len = *(const u32 *)(t + 4);
		if (*len > 4096 || !in_map(t, *len))
			return NULL;
		return (const u8 *)t;
	}
	return NULL;
}

/* Writes `value` to the I/O-port register the generic address at
 * fadt[off] names; 0 when it is not a (non-zero) port. */
static int write_gas(const u8 *fadt, u32 off, u8 value)
{
	if (fadt[off] != GAS_SYSTEM_IO)
		return 0;
	u64 port = *(const u64 *)(fadt + off + 4);
	if (port == 0 || port > 0xffff)
		return 0;
	outb((u16)port, value);
	return 1;
}

void machine_end(void)
{
	cli();
	u32 len = 0;
	const u8 *fadt = find_fadt(&len);
	switch (end_mode) {
	case END_POWEROFF:
		if (fadt && len >= FADT_MIN_LEN_SLEEP)
			write_gas(fadt, FADT_SLEEP_CONTROL_REG, (SLP_TYP_S5 << 2) | SLP_EN);
		break;
	case END_ACPI_RESET:
		if (fadt && len >= FADT_MIN_LEN_RESET)
			write_gas(fadt, FADT_RESET_REG, fadt[FADT_RESET_VALUE]);
		break;
	case END_TRIPLE:
		triple_fault();
	case END_I8042:
		break;
	}
	/* Still running: reset the old way (i8042, then a triple fault). */
	machine_reset();
}
