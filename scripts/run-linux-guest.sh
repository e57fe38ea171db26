#!/usr/bin/env bash
# Boots a real Linux guest under our own cloud-hypervisor and checks what
# its virtio-blk driver did to a qcow2 image (docs/linux-guests.md). It
# runs on the development machines, whose KVM emulates guest code: the
# kernel is the small one of scripts/build-linux-kernel.sh and /init the
# SSE-free program of tests/linux-init/ (built with make).
#
#   scripts/run-linux-guest.sh                  # the VMM's own virtio-blk
#   MODE=vhost-user scripts/run-linux-guest.sh  # ch-storage-daemon serves it
#   POWER_BUTTON=1 scripts/run-linux-guest.sh   # ends through the power button
#
# The guest gets 2 vCPUs and a 64 MiB qcow2 disk with 2 queues
# (`--disk path=IMG,num_queues=2`, or with MODE=vhost-user
# `--disk vhost_user=on,socket=S,num_queues=2` and `--memory ...,shared=on`
# against `ch-storage-daemon --export type=vhost-user-blk`). It passes
# only if every `CHTEST result` line is ok, /init printed
# `CHTEST done failures=0`, the VMM exited 0 on the guest's power-off,
# `qemu-img check` is clean and `qemu-img compare` finds the image equal to
# the one the host builds from /init's layout (tests/linux-init/main.c).
#
# Environment:
#   CH_BIN, CH_DAEMON     cloud-hypervisor / ch-storage-daemon (default:
#                         built with cargo, release)
#   CH_OWN_LINUX_KERNEL   the vmlinux (default: scripts/build-linux-kernel.sh)
#   CH_LINUX_INIT_CPIO    the initramfs (default: make -C tests/linux-init)
#   CPUS (2), QUEUES (2), MEMORY (128M), TIMEOUT seconds (900)
#   CPU_MODEL             --cpus keys after boot= (default: the x86-64
#                         baseline without KVM's hypercall-based PV IPIs,
#                         yield and unhalt, which hang on this host)
#   CLEARCPUID            features the guest kernel must not use (the ones
#                         this host's KVM shows although the model hides them)
#   KEEP=DIR              keep the image, serial log and VMM log in DIR
#   POWER_BUTTON=1        /init waits for the ACPI power button after its
#                         checks (chtest.power_button=1); the script presses
#                         it with `ch-remote power-button` (CH_REMOTE, default
#                         built with cargo) and the guest must power off
#                         through it
# Prints the result lines and how long the boot took.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { echo "run-linux-guest: $*" >&2; }

mode=${MODE:-virtio}
cpus=${CPUS:-2}
queues=${QUEUES:-2}
memory=${MEMORY:-128M}
timeout_s=${TIMEOUT:-900}
cpu_model=${CPU_MODEL:-model=x86-64-v1,hide=[kvm_pv_send_ipi,kvm_pv_sched_yield,kvm_pv_unhalt]}
# What the emulating hosts' KVM shows the guest whatever the CPU model
# says (the VMM warns with the list) and the guest kernel would run
# although KVM's emulator cannot: XSAVE (and with it every AVX and XSAVE*
# feature, which Linux clears along), POPCNT, SMAP (stac/clac), FSGSBASE,
# RDRAND/RDSEED, the fast-string and cache-flush variants, and the
# crypto instructions. Linux 6.1 reads only the first 127 characters of
# clearcpuid=, so the list stays short.
clearcpuid=${CLEARCPUID:-xsave,popcnt,smap,smep,umip,fsgsbase,rdrand,rdseed,erms,fsrm,clflushopt,clwb,movbe,sse4_2,pclmulqdq,aes}

for tool in qemu-img python3; do
    command -v "$tool" >/dev/null || { log "$tool not found (apt-get install qemu-utils python3)"; exit 1; }
done

kernel=${CH_OWN_LINUX_KERNEL:-}
if [ -z "$kernel" ]; then
    kernel=$("$repo/scripts/build-linux-kernel.sh" | sed -n 's/^CH_OWN_LINUX_KERNEL=//p')
fi
initramfs=${CH_LINUX_INIT_CPIO:-}
if [ -z "$initramfs" ]; then
    make -C "$repo/tests/linux-init" --no-print-directory >&2
    initramfs="$repo/tests/linux-init/build/initramfs.cpio"
fi

target_dir() {
    (cd "$repo" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
}
bin=${CH_BIN:-}
if [ -z "$bin" ]; then
    (cd "$repo" && cargo build -q --release -p vmm --bin cloud-hypervisor >&2)
    bin="$(target_dir)/release/cloud-hypervisor"
fi

work=$(mktemp -d /tmp/ch-linux.XXXXXX)
daemon_pid=
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
        daemon_pid=
    fi
    if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP"
        cp -a "$work/." "$KEEP/" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

image="$work/disk.qcow2"
qemu-img create -q -f qcow2 "$image" 64M

# The image /init leaves behind (its layout table, tests/linux-init/main.c).
python3 - "$work/expected.raw" "$queues" <<'PY'
import struct, sys
path, queues = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
def fill(f, off, length, seed):
    words = [(o * 0x9E3779B97F4A7C15 + seed) & (2**64 - 1) for o in range(off, off + length, 8)]
    f.seek(off)
    f.write(struct.pack("<%dQ" % len(words), *words))
with open(path, "wb") as f:
    f.truncate(64 * MIB)
    for q in range(queues):
        fill(f, (4 + q) * MIB, 256 * 1024, 0x100 + q)
    # 16 MiB: zeroed (BLKZEROOUT). 20 MiB: rewritten half, kept half.
    fill(f, 20 * MIB, MIB // 2, 0x301)
    fill(f, 20 * MIB + MIB // 2, MIB // 2, 0x300)
PY

case "$mode" in
virtio)
    memory_arg="size=$memory"
    disk_arg="path=$image,num_queues=$queues"
    ;;
vhost-user)
    daemon=${CH_DAEMON:-}
    if [ -z "$daemon" ]; then
        (cd "$repo" && cargo build -q --release -p storage-daemon --bin ch-storage-daemon >&2)
        daemon="$(target_dir)/release/ch-storage-daemon"
    fi
    socket="$work/disk.sock"
    timeout "$((timeout_s + 60))" "$daemon" --image "path=$image" \
        --export "type=vhost-user-blk,socket=$socket,num_queues=$queues,writable=on" \
        >"$work/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 200); do
        [ -S "$socket" ] && break
        kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/daemon.log" >&2; exit 1; }
        sleep 0.1
    done
    [ -S "$socket" ] || { log "no socket from ch-storage-daemon"; exit 1; }
    memory_arg="size=$memory,shared=on"
    disk_arg="vhost_user=on,socket=$socket,num_queues=$queues"
    ;;
*)
    log "MODE must be virtio or vhost-user"
    exit 2
    ;;
esac

serial="$work/serial.log"
# panic=-1: a panic resets, so the VMM exits at once; no RCU stall
# reports (emulated time makes them, and printing them is slow);
# percpu_alloc=page: per-CPU areas page by page instead of 1 MiB units
# that are zeroed first.
cmdline="console=ttyS0 panic=-1 mitigations=off tsc=reliable"
cmdline+=" rcupdate.rcu_cpu_stall_suppress=1 percpu_alloc=page printk.devkmsg=on"
cmdline+=" clearcpuid=$clearcpuid chtest.queues=$queues"
api=()
if [ -n "${POWER_BUTTON:-}" ]; then
    cmdline+=" chtest.power_button=1"
    api=(--api-socket "path=$work/api.sock")
    ch_remote=${CH_REMOTE:-}
    if [ -z "$ch_remote" ]; then
        (cd "$repo" && cargo build -q --release -p vmm --bin ch-remote >&2)
        ch_remote="$(target_dir)/release/ch-remote"
    fi
fi
log "booting $(basename "$kernel") ($mode, $cpus vCPUs, $queues queues)"
start=$(date +%s.%N)
set +e
timeout "$timeout_s" "$bin" -v \
    --kernel "$kernel" --initramfs "$initramfs" --cmdline "$cmdline" \
    --cpus "boot=$cpus,$cpu_model" --memory "$memory_arg" \
    --disk "$disk_arg" --serial "file=$serial" "${api[@]}" 2>"$work/vmm.log" &
vmm_pid=$!
if [ -n "${POWER_BUTTON:-}" ]; then
    # Press the button once /init waits for it (or give up with the VMM).
    while kill -0 "$vmm_pid" 2>/dev/null; do
        if grep -aq '^CHTEST waiting for the power button' "$serial" 2>/dev/null; then
            log "pressing the power button"
            "$ch_remote" --api-socket "$work/api.sock" power-button >&2
            break
        fi
        sleep 0.5
    done
fi
wait "$vmm_pid"
rc=$?
set -e
elapsed=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$start" "$(date +%s.%N)")
if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" || { log "ch-storage-daemon did not exit cleanly"; cat "$work/daemon.log" >&2; exit 1; }
    daemon_pid=
fi

grep -a '^CHTEST' "$serial" || true
fail() {
    log "FAILED: $*"
    log "last lines of the serial log:"
    tail -n 40 "$serial" >&2 || true
    log "VMM log:"
    tail -n 20 "$work/vmm.log" >&2 || true
    exit 1
}
[ "$rc" -eq 0 ] || fail "cloud-hypervisor exited with $rc (124: timeout after $timeout_s s)"
grep -aq 'clean exit (PowerOff)' "$work/vmm.log" || fail "the VM did not end with a power-off"
# A reset reboots the VM (a kernel panic with panic=-1, say): one boot only.
! grep -aq 'VM rebooted' "$work/vmm.log" || fail "the guest reset and was rebooted"
if [ -n "${POWER_BUTTON:-}" ]; then
    grep -aq '^CHTEST power button pressed' "$serial" || fail "/init did not see the power button"
fi
results=$(grep -ac '^CHTEST result ' "$serial" || true)
[ "$results" -eq $((6 + queues)) ] || fail "$results result lines, expected $((6 + queues))"
! grep -a '^CHTEST result ' "$serial" | grep -qv ' status=ok' || fail "a check failed"
grep -aq '^CHTEST done failures=0' "$serial" || fail "no 'CHTEST done failures=0'"
qemu-img check -q "$image" || fail "qemu-img check"
qemu-img compare -q "$work/expected.raw" "$image" || fail "qemu-img compare: the image differs from the expected one"
log "ok: $mode boot to power-off in $elapsed s"
