/*
 * pci.c - PCI configuration space through ports 0xCF8/0xCFC (mechanism #1):
 * bus-0 scan, BAR sizing, BAR assignment for BARs the VMM left at 0, the
 * capability list walk, and enabling memory decode + bus mastering.
 *
 * In:  configuration space (VMM data: BAR sizes, capability pointers are
 *      validated and walks are bounded). Out: struct pci_func records.
 */
#include "pci.h"
#include "paging.h"

#define PCI_ADDR 0xCF8
#define PCI_DATA 0xCFC
#define PCI_COMMAND 0x04
#define PCI_STATUS 0x06
#define PCI_HEADER_TYPE 0x0E
#define PCI_BAR0 0x10
#define PCI_CAP_PTR 0x34
#define CMD_IO 0x1
#define CMD_MEM 0x2
#define CMD_MASTER 0x4
#define CMD_INTX_DISABLE 0x400
#define STATUS_CAP_LIST 0x10
/* Where BARs the VMM left unassigned go: above every BAR we saw and at
 * least here, and below the IOAPIC/LAPIC area. */
#define FREE_WINDOW_MIN 0xC0000000UL
#define FREE_WINDOW_END 0xFEC00000UL

static u64 free_window_next;

static void select_reg(const struct pci_func *f, u8 reg)
{
	outl(PCI_ADDR, 0x80000000u | ((u32)f->bus << 16) | ((u32)f->dev << 11) | ((u32)f->fn << 8) |
			       (reg & 0xFC));
}

u32 pci_read32(const struct pci_func *f, u8 reg)
{
	select_reg(f, reg);
	return inl(PCI_DATA);
}

u16 pci_read16(const struct pci_func *f, u8 reg)
{
	select_reg(f, reg);
	return inw(PCI_DATA + (reg & 2));
}

u8 pci_read8(const struct pci_func *f, u8 reg)
{
	select_reg(f, reg);
	return inb(PCI_DATA + (reg & 3));
}

void pci_write32(const struct pci_func *f, u8 reg, u32 v)
{
	select_reg(f, reg);
	outl(PCI_DATA, v);
}

void pci_write16(const struct pci_func *f, u8 reg, u16 v)
{
	select_reg(f, reg);
	outw(PCI_DATA + (reg & 2), v);
}

/* Sizes the memory BARs with decoding off (the all-ones probe must not
 * move a live BAR under the CPU's feet). */
static void size_bars(struct pci_func *f)
{
	int nbars = (f->header_type & 0x7F) == 0 ? 6 : (f->header_type & 0x7F) == 1 ? 2 : 0;
	u16 cmd = pci_read16(f, PCI_COMMAND);
	pci_write16(f, PCI_COMMAND, cmd & ~(CMD_IO | CMD_MEM));
	for (int i = 0; i < nbars; i++) {
		u8 reg = (u8)(PCI_BAR0 + 4 * i);
		u32 orig = pci_read32(f, reg);
		if (orig & 1)
			continue; /* I/O BAR: not used by virtio modern */
		int is64 = ((orig >> 1) & 3) == 2 && i + 1 < nbars;
		pci_write32(f, reg, 0xFFFFFFFF);
		u64 mask = pci_read32(f, reg) & ~0xFu;
		pci_write32(f, reg, orig);
		u64 addr = orig & ~0xFu;
		if (is64) {
			u8 hreg = (u8)(reg + 4);
			u32 orig_hi = pci_read32(f, hreg);
			pci_write32(f, hreg, 0xFFFFFFFF);
			mask |= (u64)pci_read32(f, hreg) << 32;
			pci_write32(f, hreg, orig_hi);
			addr |= (u64)orig_hi << 32;
		} else {
			mask |= 0xFFFFFFFF00000000UL;
		}
		if ((mask & 0xFFFFFFFFUL) != 0 || (is64 && mask != 0)) {
			f->bar_size[i] = ~mask + 1;
			f->bar_addr[i] = addr;
			f->bar_is64[i] = (u8)is64;
		}
		if (is64)
			i++;
	}
	pci_write16(f, PCI_COMMAND, cmd);
}

int pci_scan_bus0(struct pci_func *out, int max)
{
	int n = 0;
	free_window_next = FREE_WINDOW_MIN;
	for (u8 dev = 0; dev < 32; dev++) {
		for (u8 fn = 0; fn < 8; fn++) {
			struct pci_func f;
			memset(&f, 0, sizeof(f));
			f.bus = 0;
			f.dev = dev;
			f.fn = fn;
			u32 id = pci_read32(&f, 0);
			if ((id & 0xFFFF) == 0xFFFF || id == 0) {
				if (fn == 0)
					break;
				continue;
			}
			f.vendor = (u16)id;
			f.device = (u16)(id >> 16);
			f.header_type = pci_read8(&f, PCI_HEADER_TYPE);
			size_bars(&f);
			for (int i = 0; i < PCI_MAX_BARS; i++) {
				u64 end = f.bar_addr[i] + f.bar_size[i];
				if (f.bar_addr[i] && end > free_window_next && end <= FREE_WINDOW_END)
					free_window_next = end;
			}
			if (n < max)
				out[n++] = f;
			if (fn == 0 && !(f.header_type & 0x80))
				break;
		}
	}
	return n;
}

int pci_probe_slot(u8 dev, struct pci_func *out)
{
	memset(out, 0, sizeof(*out));
	out->dev = dev;
	u32 id = pci_read32(out, 0);
	if ((id & 0xFFFF) == 0xFFFF || id == 0)
		return 0;
	out->vendor = (u16)id;
	out->device = (u16)(id >> 16);
	out->header_type = pci_read8(out, PCI_HEADER_TYPE);
	size_bars(out);
	return 1;
}

void pci_enable(struct pci_func *f)
{
	for (int i = 0; i < PCI_MAX_BARS; i++) {
		u64 size = f->bar_size[i];
		if (size == 0)
			continue;
		if (f->bar_addr[i] == 0) {
			if (size > FREE_WINDOW_END - FREE_WINDOW_MIN)
				fail("BAR%d of %02x:%02x.%x is too big (0x%lx)", i, f->bus, f->dev,
				     f->fn, size);
			u64 a = ALIGN_UP(free_window_next, size);
			if (a + size > FREE_WINDOW_END)
				fail("no room below 0x%lx for BAR%d of %02x:%02x.%x", FREE_WINDOW_END, i,
				     f->bus, f->dev, f->fn);
			u8 reg = (u8)(PCI_BAR0 + 4 * i);
			pci_write32(f, reg, (u32)a | (pci_read32(f, reg) & 0xF));
			if (f->bar_is64[i])
				pci_write32(f, (u8)(reg + 4), 0);
			f->bar_addr[i] = a;
			free_window_next = a + size;
			kprintf("info %02x:%02x.%x BAR%d was unassigned: assigned 0x%lx (size 0x%lx)\n",
				f->bus, f->dev, f->fn, i, a, size);
		}
		if (f->bar_addr[i] + size < f->bar_addr[i])
			fail("BAR%d of %02x:%02x.%x wraps around", i, f->bus, f->dev, f->fn);
		if (!paging_map_mmio(f->bar_addr[i], size))
			fail("BAR%d of %02x:%02x.%x at 0x%lx is beyond what the guest can map", i,
			     f->bus, f->dev, f->fn, f->bar_addr[i]);
	}
	u16 cmd = pci_read16(f, PCI_COMMAND);
	pci_write16(f, PCI_COMMAND, cmd | CMD_MEM | CMD_MASTER | CMD_INTX_DISABLE);
	u16 now = pci_read16(f, PCI_COMMAND);
	if ((now & (CMD_MEM | CMD_MASTER)) != (CMD_MEM | CMD_MASTER))
		fail("%02x:%02x.%x: memory/bus-master enable did not stick (command 0x%x)", f->bus,
		     f->dev, f->fn, now);
}

u8 pci_find_cap(const struct pci_func *f, u8 id, u8 after)
{
	if (!(pci_read16(f, PCI_STATUS) & STATUS_CAP_LIST))
		return 0;
	u8 pos = after ? pci_read8(f, (u8)(after + 1)) : pci_read8(f, PCI_CAP_PTR);
	/* At most 48 capabilities fit in 192 bytes: a longer walk is a loop. */
	for (int guard = 0; guard < 48 && pos >= 0x40; guard++) {
		pos &= 0xFC;
		if (pci_read8(f, pos) == id)
			return pos;
		pos = pci_read8(f, (u8)(pos + 1));
	}
	return 0;
}
