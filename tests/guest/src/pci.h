/*
 * pci.h - PCI configuration mechanism #1 and BAR handling (see pci.c).
 */
#ifndef GUEST_PCI_H
#define GUEST_PCI_H
#include "common.h"

#define PCI_MAX_BARS 6
#define PCI_CAP_ID_MSIX 0x11
#define PCI_CAP_ID_VNDR 0x09

struct pci_func {
	u8 bus, dev, fn;
	u16 vendor, device;
	u8 header_type;
	/* Memory BARs: address (0 when not a memory BAR), size, 64-bit flag. */
	u64 bar_addr[PCI_MAX_BARS];
	u64 bar_size[PCI_MAX_BARS];
	u8 bar_is64[PCI_MAX_BARS];
};

u32 pci_read32(const struct pci_func *f, u8 reg);
u16 pci_read16(const struct pci_func *f, u8 reg);
u8 pci_read8(const struct pci_func *f, u8 reg);
void pci_write32(const struct pci_func *f, u8 reg, u32 v);
void pci_write16(const struct pci_func *f, u8 reg, u16 v);

/* Scans bus 0 (all devices, all functions of multifunction devices), sizes
 * every memory BAR, and returns the functions found (at most max). */
int pci_scan_bus0(struct pci_func *out, int max);
/* Gives every zero-address memory BAR of f an address from the free window
 * above all BARs seen by the scan, maps BARs above 4 GiB, and enables memory
 * decoding and bus mastering. */
void pci_enable(struct pci_func *f);
/* Reads function 0 of bus-0 device `dev` into *out (BARs sized); 0 if the
 * slot is empty. */
int pci_probe_slot(u8 dev, struct pci_func *out);
/* Offset of the first capability with the given id after position `after`
 * (0 = start of the list), or 0 when there is none. Bounded walk. */
u8 pci_find_cap(const struct pci_func *f, u8 id, u8 after);

#endif
