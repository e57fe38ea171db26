/*
 * Threads without a C library: clone(2) onto a static stack, the child
 * pins itself to a CPU and runs a function; the parent joins through the
 * kernel's CLONE_CHILD_CLEARTID futex wake when the child exits.
 */
#include "thread.h"

#define STACK_SIZE 65536

static u8 stacks[MAX_THREADS][STACK_SIZE] __attribute__((aligned(16)));

/* The child starts with fn and arg on its new stack (see thread_start). */
static i64 clone_thread(u64 *stack_top, int *tid_word)
{
	i64 ret;
	register i64 r10 __asm__("r10") = (i64)tid_word;
	register i64 r8 __asm__("r8") = 0;
	const i64 flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
			  CLONE_SYSVSEM | CLONE_CHILD_CLEARTID;
	__asm__ volatile("syscall\n"
			 "	test %%rax, %%rax\n"
			 "	jnz 1f\n"
			 /* Child: its stack holds arg, then fn. */
			 "	pop %%rdi\n"
			 "	pop %%rax\n"
			 "	call *%%rax\n"
			 "	mov $60, %%eax\n" /* exit (this thread only) */
			 "	xor %%edi, %%edi\n"
			 "	syscall\n"
			 "	hlt\n"
			 "1:\n"
			 : "=a"(ret)
			 : "a"(SYS_clone), "D"(flags), "S"(stack_top - 2), "d"(0), "r"(r10), "r"(r8)
			 : "rcx", "r11", "memory");
	return ret;
}

i64 thread_start(struct thread *t, int slot, void (*fn)(void *), void *arg)
{
	u64 *top = (u64 *)(stacks[slot] + STACK_SIZE);
	top[-1] = (u64)fn;
	top[-2] = (u64)arg;
	t->tid_word = 1;
	i64 tid = clone_thread(top, &t->tid_word);
	if (tid < 0)
		t->tid_word = 0;
	return tid;
}

/* Waits until the kernel cleared the thread's tid word at its exit. */
void thread_join(struct thread *t)
{
	for (;;) {
		int v = __atomic_load_n(&t->tid_word, __ATOMIC_ACQUIRE);
		if (v == 0)
			return;
		sys6(SYS_futex, (i64)&t->tid_word, FUTEX_WAIT, v, 0, 0, 0);
	}
}

i64 pin_to_cpu(int cpu)
{
	u64 mask = 1UL << cpu;
	return sys3(SYS_sched_setaffinity, 0, sizeof(mask), &mask);
}

int current_cpu(void)
{
	u32 cpu = ~0U;
	sys3(SYS_getcpu, &cpu, 0, 0);
	return (int)cpu;
}
