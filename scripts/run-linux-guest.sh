#!/usr/bin/env bash
# Boots a user-supplied Linux kernel and root filesystem under
# cloud-hypervisor and runs fio inside against a second, scratch virtio-blk
# disk; see docs/linux-guests.md.
#
#   scripts/run-linux-guest.sh KERNEL ROOTFS [SCRATCH_IMAGE]
#
# KERNEL: a vmlinux with a PVH note (CONFIG_PVH=y) or a bzImage, with
#   virtio-pci, virtio-blk, PCI MSI, the 8250 console and the root
#   filesystem's driver built in.
# ROOTFS: a raw or qcow2 image holding the root filesystem directly (no
#   partition table; it becomes /dev/vda) with /bin/sh, mount, reboot and
#   fio installed. It is attached read-only and mounted `ro`; PID 1 is
#   `/bin/sh -c '<mount, fio, reboot>'` given on the kernel command line,
#   so nothing on it is modified.
# SCRATCH_IMAGE: optional; default a new 1 GiB qcow2 in a temp dir. It
#   becomes /dev/vdb and fio writes to it.
#
# Environment: CH_BIN (cloud-hypervisor binary; default the release
# build), CPUS (2), MEMORY (1G), QUEUES (2), ENGINE (auto), DIRECT (on),
# FIO_ARGS (default: 4 KiB random read/write, iodepth 32, 20 s, io_uring
# falling back to libaio), TIMEOUT seconds (900).
#
# The guest shuts down with `reboot -f` (reboot=k: through the i8042),
# which makes cloud-hypervisor exit. The script exits non-zero unless the
# serial log shows fio's summary and "CH-LINUX-DONE".
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ $# -lt 2 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
fi
kernel=$1
rootfs=$2
work=$(mktemp -d /tmp/ch-linux.XXXXXX)
scratch=${3:-$work/scratch.qcow2}
[ -e "$scratch" ] || qemu-img create -q -f qcow2 "$scratch" 1G

bin=${CH_BIN:-}
if [ -z "$bin" ]; then
    (cd "$repo" && cargo build --release -p vmm --bin cloud-hypervisor >&2)
    target_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    bin="$target_dir/release/cloud-hypervisor"
fi

fio_args=${FIO_ARGS:-"--name=randrw --filename=/dev/vdb --direct=1 --rw=randrw --bs=4k --iodepth=32 --ioengine=io_uring --runtime=20 --time_based --group_reporting"}
# Runs as PID 1: mount what fio needs, run it (libaio if io_uring is
# missing in the guest kernel), then reboot (the VMM exits on reset).
guest_script="mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev 2>/dev/null; \
echo CH-LINUX-START; fio $fio_args || fio ${fio_args/io_uring/libaio}; \
echo CH-LINUX-DONE; sync; reboot -f"

serial="$work/serial.log"
echo "run-linux-guest: serial log $serial" >&2
set +e
timeout "${TIMEOUT:-900}" "$bin" \
    --kernel "$kernel" \
    --cmdline "console=ttyS0 reboot=k panic=-1 root=/dev/vda ro rootwait init=/bin/sh -- -c \"$guest_script\"" \
    --cpus "boot=${CPUS:-2}" --memory "size=${MEMORY:-1G}" \
    --disk "path=$rootfs,readonly=on" \
    --disk "path=$scratch,num_queues=${QUEUES:-2},engine=${ENGINE:-auto},direct=${DIRECT:-on}" \
    --serial "file=$serial" -v
rc=$?
set -e
cat "$serial"
if [ $rc -ne 0 ]; then
    echo "run-linux-guest: cloud-hypervisor exited with $rc" >&2
    exit 1
fi
grep -q "CH-LINUX-DONE" "$serial" || { echo "run-linux-guest: fio did not finish" >&2; exit 1; }
grep -Eq "(READ|WRITE|read|write): *(bw|IOPS)" "$serial" || { echo "run-linux-guest: no fio summary" >&2; exit 1; }
qemu-img check "$scratch"
echo "run-linux-guest: done"
