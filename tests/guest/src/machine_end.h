/*
 * machine_end.h - how a run ends (see machine_end.c).
 */
#ifndef GUEST_MACHINE_END_H
#define GUEST_MACHINE_END_H
#include "common.h"

enum end_mode { END_POWEROFF, END_ACPI_RESET, END_I8042, END_TRIPLE };

/* Remembers where the ACPI tables are and how to end (end= option). */
void machine_end_setup(u64 rsdp_paddr, enum end_mode mode);

/* Ends the run as set up; never returns. */
void machine_end(void) __attribute__((noreturn));

#endif
