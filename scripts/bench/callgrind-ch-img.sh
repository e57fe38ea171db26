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
. "$(dirname "$0")/callgrind-common.sh"

opts=(-f qcow2 -c "$count" -d 32 -s 4k --random -t none -i io_uring -q)

# command_for WORKLOAD BIN: one run (see callgrind-common.sh).
command_for() {
    case $1 in
        read-allocated) cmd=("$2" bench "${opts[@]}" "$alloc") ;;
        write-allocating) cmd=("$2" bench "${opts[@]}" -w "$fresh") ;;
        read-compressed) cmd=("$2" bench "${opts[@]}" "$comp") ;;
    esac
}

main "$0 WORKDIR CH_IMG [CH_IMG...]" "$@"
