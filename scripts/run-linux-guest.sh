#!/usr/bin/env bash
# Boots the Linux test guest (the kernel and initramfs of
# scripts/build-linux-guest.sh, the same the QEMU suite boots) under our own
# cloud-hypervisor on a host with real KVM, runs the /init steps on a
# virtio-blk disk and checks the results; see docs/linux-guests.md.
# This cannot be run on the development machines (their KVM emulates guest
# code): it has not been seen to work yet.
#
#   scripts/run-linux-guest.sh [IMAGE]
#
# IMAGE: a raw or qcow2 image of at least 128 MiB the guest may overwrite;
#   default a new 256 MiB qcow2 in a temp dir.
#
# Environment:
#   CH_BIN        cloud-hypervisor binary (default: cargo build --release)
#   CH_DAEMON     ch-storage-daemon binary (MODE=vhost-user; default: built)
#   MODE          virtio (the VMM's own virtio-blk, default) or vhost-user
#                 (ch-storage-daemon serves the image, guest RAM shared)
#   CPUS (2), MEMORY (1G), QUEUES (2), TIMEOUT seconds (600)
#   STEPS         /init steps (info,ext4,fio,irqs,discard)
#   CHTEST_ARGS   more chtest.KEY=VALUE words (see scripts/linux-guest-init.sh)
#   CH_LINUX_KERNEL, CH_LINUX_INITRAMFS  use these instead of building
#
# Exits non-zero unless the guest powered off (the VMM exits 0 on ACPI S5)
# after printing "CHTEST done failures=0", and qemu-img check (qcow2) is
# clean.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

work=$(mktemp -d /tmp/ch-linux.XXXXXX)
image=${1:-$work/disk.qcow2}
[ -e "$image" ] || qemu-img create -q -f qcow2 "$image" 256M

if [ -z "${CH_LINUX_KERNEL:-}" ] || [ -z "${CH_LINUX_INITRAMFS:-}" ]; then
    guest=$("$repo/scripts/build-linux-guest.sh")
    CH_LINUX_KERNEL=$(sed -n 's/^CH_LINUX_KERNEL=//p' <<<"$guest")
    CH_LINUX_INITRAMFS=$(sed -n 's/^CH_LINUX_INITRAMFS=//p' <<<"$guest")
fi

target_dir() {
    (cd "$repo" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
}
bin=${CH_BIN:-}
if [ -z "$bin" ]; then
    (cd "$repo" && cargo build --release -p vmm --bin cloud-hypervisor >&2)
    bin="$(target_dir)/release/cloud-hypervisor"
fi

cpus=${CPUS:-2}
memory=${MEMORY:-1G}
queues=${QUEUES:-2}
mode=${MODE:-virtio}
timeout_s=${TIMEOUT:-600}
daemon_pid=
# Stops the daemon (SIGTERM: it flushes and closes the image) and waits.
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
        daemon_pid=
    fi
}
trap cleanup EXIT

case "$mode" in
virtio)
    memory_arg="size=$memory"
    disk_arg="path=$image,num_queues=$queues"
    ;;
vhost-user)
    daemon=${CH_DAEMON:-}
    if [ -z "$daemon" ]; then
        (cd "$repo" && cargo build --release -p storage-daemon --bin ch-storage-daemon >&2)
        daemon="$(target_dir)/release/ch-storage-daemon"
    fi
    socket="$work/disk.sock"
    timeout "$((timeout_s + 30))" "$daemon" --image "path=$image" \
        --export "type=vhost-user-blk,socket=$socket,num_queues=$queues,writable=on" \
        >"$work/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 100); do
        [ -S "$socket" ] && break
        kill -0 "$daemon_pid" 2>/dev/null || { cat "$work/daemon.log" >&2; exit 1; }
        sleep 0.1
    done
    [ -S "$socket" ] || { echo "run-linux-guest: no socket from ch-storage-daemon" >&2; exit 1; }
    memory_arg="size=$memory,shared=on"
    disk_arg="vhost_user=on,socket=$socket,num_queues=$queues"
    ;;
*)
    echo "run-linux-guest: MODE must be virtio or vhost-user" >&2
    exit 2
    ;;
esac

serial="$work/serial.log"
cmdline="console=ttyS0 quiet loglevel=1 panic=-1 i8042.noaux i8042.nokbd"
cmdline+=" chtest=${STEPS:-info,ext4,fio,irqs,discard} ${CHTEST_ARGS:-}"
echo "run-linux-guest: serial log $serial" >&2
set +e
timeout "$timeout_s" "$bin" \
    --kernel "$CH_LINUX_KERNEL" --initramfs "$CH_LINUX_INITRAMFS" \
    --cmdline "$cmdline" \
    --cpus "boot=$cpus" --memory "$memory_arg" \
    --disk "$disk_arg" \
    --serial "file=$serial"
rc=$?
set -e
cleanup
grep -a 'CHTEST' "$serial" || true
if [ $rc -ne 0 ]; then
    echo "run-linux-guest: cloud-hypervisor exited with $rc (124: timeout)" >&2
    tail -n 40 "$serial" >&2
    exit 1
fi
grep -aq 'CHTEST done failures=0' "$serial" ||
    { echo "run-linux-guest: the guest reported failures" >&2; exit 1; }
if [ "$(qemu-img info "$image" | sed -n 's/^file format: //p')" = qcow2 ]; then
    qemu-img check "$image"
fi
echo "run-linux-guest: done"
