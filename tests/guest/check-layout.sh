#!/usr/bin/env bash
# Checks, with qemu-io, that a disk image holds what the test guest leaves
# on a writable disk that started zero-filled (see README.md, "The layout
# it leaves"): for each queue q whose 256 KiB region fits in the first
# 8 MiB and the image, bytes 0x40+q, bytes 0x80+q, the untouched gap
# (zeroes) and the write-zeroes range (zeroes). For qcow2 images it also
# runs `qemu-img check`.
#
# Usage: check-layout.sh IMAGE FORMAT QUEUES     (FORMAT: raw or qcow2)
# Exit:  0 when everything matches, 1 with a message naming the first
#        range that does not, 2 on bad usage.
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 IMAGE raw|qcow2 QUEUES" >&2
    exit 2
fi
img="$1" fmt="$2" nq="$3"
case "$nq" in '' | *[!0-9]*) echo "check-layout: QUEUES must be a number" >&2; exit 2 ;; esac

size=$(qemu-img info -f "$fmt" --output=json "$img" | sed -n 's/.*"virtual-size": *\([0-9]*\).*/\1/p')
if [ -z "$size" ]; then
    echo "check-layout: cannot read the size of $img" >&2
    exit 2
fi
area=$((size < 8388608 ? size : 8388608))

cmds=()
for ((q = 0; q < nq && (q + 1) * 262144 <= area; q++)); do
    b=$((q * 262144))
    cmds+=(-c "read -P $((0x40 + q)) $b 65536")
    cmds+=(-c "read -P $((0x80 + q)) $((b + 65536)) 4096")
    cmds+=(-c "read -P 0 $((b + 69632)) 61440")
    cmds+=(-c "read -P 0 $((b + 196608)) 65536")
done
if [ ${#cmds[@]} -eq 0 ]; then
    echo "check-layout: $img: no queue region fits, nothing to check"
    exit 0
fi

rc=0
out=$(qemu-io -f "$fmt" -r "${cmds[@]}" "$img" 2>&1) || rc=$?
if [ "$rc" -ne 0 ] || grep -q 'Pattern verification failed' <<<"$out"; then
    echo "check-layout: $img does not hold the documented layout:"
    grep 'Pattern verification failed' <<<"$out" | head -n 4 | sed 's/^/    /'
    exit 1
fi
if [ "$fmt" = qcow2 ] && ! qemu-img check -q "$img"; then
    echo "check-layout: qemu-img check $img failed"
    exit 1
fi
echo "check-layout: $img holds the layout of $q queue(s)"
