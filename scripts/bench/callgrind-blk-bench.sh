#!/usr/bin/env bash
# User-space instructions per request of blk-bench (the virtio-blk
# device, its queue worker and the host-side driver that plays the
# guest) under callgrind, for one or more blk-bench binaries (a build of
# main and one of a branch): the device-path companion of
# callgrind-ch-img.sh, the same three workloads, so a refactoring shows
# it costs nothing on the request path of either.
#
# Workloads (4 KiB requests, one queue, QD 32, io_uring, O_DIRECT,
# 20000 requests; the adaptive spin off, --poll-us 0, so the count does
# not depend on how long a thread waited):
#   read-allocated   random reads of a 1 GiB qcow2 whose clusters are all
#                    allocated (qemu-img create -o preallocation=falloc)
#   write-allocating random writes into a fresh 1 GiB qcow2 (every new
#                    cluster is allocated; a new image per run)
#   read-compressed  random reads of a 256 MiB compressed qcow2 (qemu-img
#                    convert -c of compressible text)
#
# usage: scripts/bench/callgrind-blk-bench.sh WORKDIR BLK_BENCH [BLK_BENCH...]
# WORKDIR must be on a file system with O_DIRECT (not tmpfs before 6.6).
# Prints one line per binary and workload: the median over RUNS runs
# (default 3) of the instructions, the requests, and instructions per
# request (the whole process: device set-up, every thread, tear-down),
# then every run's count.
set -euo pipefail
. "$(dirname "$0")/callgrind-common.sh"

opts=(--format qcow2 --engine io_uring --direct on --queues 1 --qd 32 --bs 4k
      --io-size $((count * 4))k --runtime 3600 --poll-us 0)

# command_for WORKLOAD BIN: one run (see callgrind-common.sh).
command_for() {
    case $1 in
        read-allocated) cmd=("$2" "${opts[@]}" --rw randread --image "$alloc") ;;
        write-allocating) cmd=("$2" "${opts[@]}" --rw randwrite --image "$fresh") ;;
        read-compressed) cmd=("$2" "${opts[@]}" --rw randread --image "$comp") ;;
    esac
}

main "$0 WORKDIR BLK_BENCH [BLK_BENCH...]" "$@"
