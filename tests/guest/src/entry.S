/*
 * entry.S - PVH entry point, switch to long mode, interrupt stubs, reset.
 *
 * In:  the VMM jumps to pvh_entry in 32-bit protected mode, paging off,
 *      %ebx = physical address of struct hvm_start_info (PVH boot ABI).
 * Out: guest_main(start_info) runs in 64-bit mode with the first 4 GiB
 *      identity-mapped with 2 MiB pages; every interrupt and exception goes
 *      through isr_common to isr_dispatch(frame) in C.
 */

#define XEN_ELFNOTE_PHYS32_ENTRY 18

	/* The note the loader looks for: name "Xen", type 18, descriptor =
	 * the 32-bit physical entry point (stored as 8 bytes, high half zero,
	 * so loaders that read 4 or 8 bytes both see the right value). */
	.section .note.Xen, "a", @note
	.balign 4
	.long 4
	.long 8
	.long XEN_ELFNOTE_PHYS32_ENTRY
	.asciz "Xen"
	.balign 4
	.quad pvh_entry
	.balign 4

	.section .text.entry, "ax"
	.code32
	.globl pvh_entry
pvh_entry:
	cli
	cld
	/* %ebx (start_info) must survive until guest_main; nothing below
	 * touches it. */
	lgdt gdt_desc
	ljmp $0x08, $1f
1:
	movl $0x10, %eax
	movl %eax, %ds
	movl %eax, %es
	movl %eax, %ss
	movl %eax, %fs
	movl %eax, %gs

	/* Zero .bss (page tables, stack, rings, buffers). */
	movl $__bss_start, %edi
	movl $__bss_end, %ecx
	subl %edi, %ecx
	shrl $2, %ecx
	xorl %eax, %eax
	rep stosl

	/* PML4[0] -> PDPT; PDPT[0..3] -> the four page directories. */
	movl $pdpt, %eax
	orl $0x3, %eax
	movl %eax, pml4
	movl $pd0, %eax
	orl $0x3, %eax
	movl %eax, pdpt
	addl $0x1000, %eax
	movl %eax, pdpt + 8
	addl $0x1000, %eax
	movl %eax, pdpt + 16
	addl $0x1000, %eax
	movl %eax, pdpt + 24

	/* 2048 2 MiB pages: present, writable, PS. The top GiB (MMIO: PCI
	 * window, IOAPIC, LAPIC) is mapped uncached (PCD|PWT). */
	xorl %ecx, %ecx
2:
	movl %ecx, %eax
	shll $21, %eax
	orl $0x83, %eax
	cmpl $1536, %ecx
	jb 3f
	orl $0x18, %eax
3:
	movl %eax, pd0(, %ecx, 8)
	incl %ecx
	cmpl $2048, %ecx
	jb 2b

	movl %cr4, %eax
	orl $0x20, %eax			/* PAE */
	movl %eax, %cr4
	movl $pml4, %eax
	movl %eax, %cr3
	movl $0xC0000080, %ecx		/* EFER */
	rdmsr
	orl $0x100, %eax		/* LME */
	wrmsr
	movl %cr0, %eax
	orl $0x80000001, %eax		/* PG | PE */
	movl %eax, %cr0
	ljmp $0x18, $long_mode

	.code64
long_mode:
	movl $0x10, %eax
	movl %eax, %ds
	movl %eax, %es
	movl %eax, %ss
	movl %eax, %fs
	movl %eax, %gs
	movabsq $stack_top, %rsp
	xorl %ebp, %ebp
	movl %ebx, %edi			/* zero-extends: start_info paddr */
	call guest_main
	jmp machine_reset

	/* Reset: i8042 pulse (port 0x64 <- 0xFE); if the VMM ignores it,
	 * load an empty IDT and raise an exception: triple fault. */
	.text
	.globl machine_reset
machine_reset:
	cli
	movb $0xFE, %al
	outb %al, $0x64
	.globl triple_fault
triple_fault:
	cli
	lidt empty_idt_desc
	int3
4:	hlt
	jmp 4b

	/* Interrupt stubs, 16 bytes apart: isr_stubs + 16 * vector. Vectors
	 * whose exception pushes an error code skip the dummy push, so the
	 * frame is the same for all. */
	.balign 16
	.globl isr_stubs
isr_stubs:
	.set vec, 0
	.rept 256
	.balign 16
	.if (vec == 8) || ((vec >= 10) && (vec <= 14)) || (vec == 17) || (vec == 21) || (vec == 29) || (vec == 30)
	.else
	pushq $0
	.endif
	pushq $vec
	jmp isr_common
	.set vec, vec + 1
	.endr

	/* Saves the caller-saved registers (the C handler keeps the others),
	 * passes the frame to isr_dispatch, returns with iretq. The CPU
	 * aligned %rsp to 16 before pushing its 5 words; 2 + 9 more keep the
	 * call 16-byte aligned. */
isr_common:
	pushq %rax
	pushq %rcx
	pushq %rdx
	pushq %rsi
	pushq %rdi
	pushq %r8
	pushq %r9
	pushq %r10
	pushq %r11
	movq %rsp, %rdi
	cld
	call isr_dispatch
	popq %r11
	popq %r10
	popq %r9
	popq %r8
	popq %rdi
	popq %rsi
	popq %rdx
	popq %rcx
	popq %rax
	addq $16, %rsp
	iretq

	.section .rodata
	.balign 16
gdt:
	.quad 0
	.quad 0x00CF9A000000FFFF	/* 0x08: 32-bit code */
	.quad 0x00CF92000000FFFF	/* 0x10: data */
	.quad 0x00AF9A000000FFFF	/* 0x18: 64-bit code */
gdt_end:
	.balign 8
gdt_desc:
	.word gdt_end - gdt - 1
	.long gdt
	.balign 8
empty_idt_desc:
	.word 0
	.quad 0

	.section .bss
	.balign 4096
	.globl pml4, pdpt
pml4:	.skip 4096
pdpt:	.skip 4096
pd0:	.skip 4 * 4096
	.balign 16
stack_bottom:
	.skip 32768
stack_top:

	.section .note.GNU-stack, "", @progbits
