#!/usr/bin/env bash
# User-space instructions per request of `ch-img bench` under callgrind,
# for one or more ch-img binaries (a build of main and one of a branch):
# instruction counts repeat on a loaded machine where timings do not, so
# this is how a refactoring shows it costs nothing on the request path.
#
# Workloads (4 KiB requests, QD 32, io_uring, O_DIRECT, 20000 requests):
#   read-allocated   random reads of a 1 GiB qcow2 whose clusters are all
#                    allocated (qemu-img create -o preallocation=falloc)
#   write-allocating random writes into a fresh 1 GiB qcow2 (every new
#                    cluster is allocated; a new image per run)
#   read-compressed  random reads of a 256 MiB compressed qcow2 (qemu-img
#                    convert -c of compressible text)
#
# usage: scripts/bench/callgrind-ch-img.sh WORKDIR CH_IMG [CH_IMG...]
# WORKDIR must be on a file system with O_DIRECT (not tmpfs before 6.6).
# Prints one line per binary and workload: the median over RUNS runs
# (default 3; thread timing moves the count a little from run to run) of
# the instructions, the requests, and instructions per request (the
# whole process: open, threads, close), then every run's count.
set -euo pipefail
work=${1:?usage: $0 WORKDIR CH_IMG [CH_IMG...]}
shift
[ $# -ge 1 ] || { echo "usage: $0 WORKDIR CH_IMG [CH_IMG...]" >&2; exit 2; }
mkdir -p "$work"
count=20000
runs=${RUNS:-3}
opts=(-f qcow2 -c "$count" -d 32 -s 4k --random -t none -i io_uring -q)

alloc=$work/allocated.qcow2
[ -f "$alloc" ] || qemu-img create -q -f qcow2 -o preallocation=falloc "$alloc" 1G
comp=$work/compressed.qcow2
if [ ! -f "$comp" ]; then
    seq 1 30000000 > "$work/text.raw"
    truncate -s 256M "$work/text.raw"
    qemu-img convert -q -c -O qcow2 "$work/text.raw" "$comp"
    rm -f "$work/text.raw"
fi

# instructions BIN ARGS...: total Ir of every thread of one run.
instructions() {
    local out=$work/callgrind.out
    rm -f "$out"*
    valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>"$work/valgrind.log" \
        || { cat "$work/valgrind.log" >&2; return 1; }
    sed -n 's/^summary: *//p' "$out" | awk '{s += $1} END {printf "%.0f\n", s}'
}

printf '%-40s %-17s %14s %9s %11s  %s\n' binary workload instructions requests per-request runs
for bin in "$@"; do
    for w in read-allocated write-allocating read-compressed; do
        all=()
        for _ in $(seq "$runs"); do
            case $w in
                read-allocated) args=("${opts[@]}" "$alloc") ;;
                write-allocating)
                    fresh=$work/fresh.qcow2
                    rm -f "$fresh"
                    qemu-img create -q -f qcow2 "$fresh" 1G
                    args=("${opts[@]}" -w "$fresh") ;;
                read-compressed) args=("${opts[@]}" "$comp") ;;
            esac
            all+=("$(instructions "$bin" bench "${args[@]}")")
        done
        ir=$(printf '%s\n' "${all[@]}" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
        printf '%-40s %-17s %14s %9d %11.1f  %s\n' "$bin" "$w" "$ir" "$count" \
            "$(echo "$ir / $count" | bc -l)" "${all[*]}"
    done
done
