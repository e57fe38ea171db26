/*
 * Waiting for the ACPI power button (see button.c).
 */
#ifndef LINUX_INIT_BUTTON_H
#define LINUX_INIT_BUTTON_H
#include "sys.h"

/* Blocks until the power button is pressed: 0, or -errno. */
i64 wait_power_button(void);

#endif
