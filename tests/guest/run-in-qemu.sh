#!/usr/bin/env bash
# Boots the test guest under qemu-system-x86_64 (the oracle VMM) in a few
# disk set-ups and checks both the guest's verdict (RESULT: PASS on serial)
# and, with qemu-io/qemu-img, the layout it documents in README.md.
#
# Needs: qemu-system-x86 (apt-get install -y qemu-system-x86), qemu-utils.
# Env:   ACCEL=tcg|kvm (default tcg), TIMEOUT=seconds per boot (default 120),
#        KEEP=1 keeps the scratch directory.
# Exit:  0 when every scenario passes, 1 otherwise.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
accel="${ACCEL:-tcg}"
timeout_s="${TIMEOUT:-120}"

for tool in qemu-system-x86_64 qemu-img qemu-io; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "run-in-qemu: '$tool' not found (apt-get install -y qemu-system-x86 qemu-utils)" >&2
        exit 1
    fi
done

elf="$("$repo/scripts/build-test-guest.sh" | tail -n 1)"
work="$(mktemp -d)"
if [ "${KEEP:-0}" = 1 ]; then
    echo "scratch directory: $work"
else
    trap 'rm -rf "$work"' EXIT
fi
failures=0

# boot NAME CMDLINE QEMU-DEVICE-ARGS...: boots, saves the serial log, checks
# for RESULT: PASS and that QEMU exited (the guest resets; -no-reboot exits).
boot() {
    local name="$1" cmdline="$2"
    shift 2
    local log="$work/$name.log" start end rc=0
    start=$(date +%s.%N)
    timeout "$timeout_s" qemu-system-x86_64 -machine q35 -accel "$accel" -m 128 \
        -display none -serial "file:$log" -monitor none -no-reboot \
        -kernel "$elf" -append "$cmdline" "$@" || rc=$?
    end=$(date +%s.%N)
    local secs
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    if [ "$rc" -ne 0 ]; then
        echo "FAIL $name: qemu exited with $rc after ${secs}s (124 = timeout)"
        tail -n 5 "$log" 2>/dev/null | sed 's/^/    /'
        failures=$((failures + 1))
        return 1
    fi
    if ! grep -q '^RESULT: PASS$' "$log"; then
        echo "FAIL $name: $(grep -a '^RESULT:' "$log" || echo 'no RESULT line') (${secs}s)"
        failures=$((failures + 1))
        return 1
    fi
    echo "ok   $name: RESULT: PASS in ${secs}s ($(grep -c '^ok ' "$log") checks)"
}

# read_p IMG FMT VALUE OFFSET LEN: qemu-io pattern check of one range.
read_p() {
    local img="$1" fmt="$2" value="$3" off="$4" len="$5"
    local out rc=0
    out=$(qemu-io -f "$fmt" -r -c "read -P $value $off $len" "$img" 2>&1) || rc=$?
    if [ "$rc" -ne 0 ] || grep -q 'Pattern verification failed' <<<"$out"; then
        echo "FAIL $(basename "$img"): bytes $off+$len are not all $value"
        failures=$((failures + 1))
        return 1
    fi
}

# check_layout IMG FMT QUEUES: the ranges README.md promises for a disk
# that started zero-filled (check-layout.sh does the work).
check_layout() {
    local out
    if out=$("$here/check-layout.sh" "$1" "$2" "$3"); then
        echo "ok   ${out#check-layout: }"
    else
        echo "FAIL ${out#check-layout: }"
        failures=$((failures + 1))
        return 1
    fi
}

# 1. One raw disk, four queues, a serial.
qemu-img create -q -f raw "$work/raw4.img" 16M
boot raw4 "disks=1" \
    -drive "file=$work/raw4.img,if=none,id=d0,format=raw,discard=unmap" \
    -device virtio-blk-pci,drive=d0,num-queues=4,disable-legacy=on,serial=abc123 &&
    check_layout "$work/raw4.img" raw 4 || true

# 2. A qcow2 disk with one queue (transitional device: 0x1001 with modern
#    caps), and the guest refusing EVENT_IDX and indirect descriptors.
qemu-img create -q -f qcow2 "$work/q1.qcow2" 16M
boot qcow2-1q "disks=1 event_idx=off indirect=off" \
    -drive "file=$work/q1.qcow2,if=none,id=d0,format=qcow2,discard=unmap" \
    -device virtio-blk-pci,drive=d0,num-queues=1,serial=q1 &&
    check_layout "$work/q1.qcow2" qcow2 1 || true

# 3. Two disks: read-write raw (2 queues) and a read-only raw disk whose
#    content (bytes 0x5a) must survive.
qemu-img create -q -f raw "$work/rw2.img" 16M
qemu-img create -q -f raw "$work/ro.img" 16M
qemu-io -f raw -c "write -P 0x5a 0 8M" "$work/ro.img" >/dev/null
boot two-disks-ro "disks=2" \
    -drive "file=$work/rw2.img,if=none,id=d0,format=raw" \
    -device virtio-blk-pci,drive=d0,num-queues=2,disable-legacy=on,serial=rw \
    -drive "file=$work/ro.img,if=none,id=d1,format=raw,readonly=on" \
    -device virtio-blk-pci,drive=d1,num-queues=2,disable-legacy=on,serial=ro &&
    check_layout "$work/rw2.img" raw 2 &&
    read_p "$work/ro.img" raw 0x5a 0 8M &&
    echo "ok   ro.img: unchanged" || true

# 4. A disk smaller than the test area: 1 MiB holds the regions of queues
#    0..3 only; queues 4..7 must be skipped, not fail.
qemu-img create -q -f raw "$work/small.img" 1M
boot small-8q "disks=1" \
    -drive "file=$work/small.img,if=none,id=d0,format=raw" \
    -device virtio-blk-pci,drive=d0,num-queues=8,disable-legacy=on &&
    check_layout "$work/small.img" raw 4 || true

# 6. Three disks: 16 queues, a 16-entry ring (seg_max 14: requests are
#    re-split) and a 4-entry ring (seg_max 2).
for i in 0 1 2; do qemu-img create -q -f raw "$work/m$i.img" 16M; done
boot three-disks "disks=3" \
    -drive "file=$work/m0.img,if=none,id=d0,format=raw" \
    -device virtio-blk-pci,drive=d0,num-queues=16,disable-legacy=on \
    -drive "file=$work/m1.img,if=none,id=d1,format=raw" \
    -device virtio-blk-pci,drive=d1,num-queues=2,queue-size=16,disable-legacy=on \
    -drive "file=$work/m2.img,if=none,id=d2,format=raw" \
    -device virtio-blk-pci,drive=d2,num-queues=1,queue-size=4,disable-legacy=on &&
    check_layout "$work/m0.img" raw 16 &&
    check_layout "$work/m1.img" raw 2 &&
    check_layout "$work/m2.img" raw 1 || true

# 5. The guest must notice a wrong disk count (and still end and reset).
saved=$failures
boot wrong-count "disks=2" \
    -drive "file=$work/small.img,if=none,id=d0,format=raw" \
    -device virtio-blk-pci,drive=d0,disable-legacy=on >/dev/null || true
failures=$saved
if grep -q '^RESULT: FAIL found 1 virtio-blk device(s), cmdline says disks=2$' "$work/wrong-count.log"; then
    echo "ok   wrong-count: guest reported the missing disk"
else
    echo "FAIL wrong-count: $(grep -a '^RESULT:' "$work/wrong-count.log" || echo 'no RESULT line')"
    failures=$((failures + 1))
fi

if [ "$failures" -ne 0 ]; then
    echo "run-in-qemu: $failures failure(s); logs in $work (KEEP=1 to keep them)"
    exit 1
fi
echo "run-in-qemu: all scenarios passed (accel $accel)"
