/*
 * irq.h - interrupt state shared with the virtqueue wait loop (see irq.c).
 */
#ifndef GUEST_IRQ_H
#define GUEST_IRQ_H
#include "common.h"

/* LAPIC timer period is about 10 ms; timeouts are counted in these ticks. */
#define IRQ_TICKS_PER_SECOND 100

/* Interrupts seen per vector, and LAPIC timer ticks. */
extern volatile u32 irq_count[256];
extern volatile u64 irq_ticks;
/* First vector that fired although no device or timer was given it (0 if
 * none): a sign of MSI routing gone wrong. */
extern volatile u32 irq_unexpected;
/* APIC id of this CPU: the destination of every MSI we program. */
extern u32 irq_apic_id;

/* IDT, LAPIC, timer; enables interrupts and checks the timer ticks. */
void irq_init(void);
/* A fresh vector for one MSI-X entry (fails the run when none is left). */
u32 irq_alloc_vector(void);

#endif
