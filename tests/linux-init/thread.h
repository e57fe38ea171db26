#ifndef LINUX_INIT_THREAD_H
#define LINUX_INIT_THREAD_H

#include "sys.h"

#define MAX_THREADS 8

struct thread {
	/* Set to non-zero at start; the kernel zeroes it and wakes us at exit. */
	int tid_word;
};

/* Starts fn(arg) on thread stack `slot`; returns the tid or -errno. */
i64 thread_start(struct thread *t, int slot, void (*fn)(void *), void *arg);
void thread_join(struct thread *t);
i64 pin_to_cpu(int cpu);
int current_cpu(void);

#endif
