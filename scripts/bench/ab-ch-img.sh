#!/bin/sh
# Interleaved A/B of two ch-img builds on the executor's hot paths: each
# round runs every case with build A, then with build B, and the table
# gives each case's median CPU time (perf's task-clock: user + system of
# the whole run), which a busy machine disturbs less than a rate.
#
# Usage: scripts/bench/ab-ch-img.sh A/ch-img B/ch-img [ROUNDS] [DIR]
# Needs: perf, qemu-img, python3. Images (~400 MiB) go to DIR
# (default /dev/shm/ch-ab), which is removed at the end.
# Cases: qcow2 random 4 KiB reads and writes at QD 32 on the sync
# engine, reads of a zstd-compressed image (the compressed-read
# pipeline), and random reads on io_uring.
set -eu
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
a=$1 b=$2 rounds=${3:-9} dir=${4:-/dev/shm/ch-ab}
for tool in perf qemu-img python3; do
    command -v "$tool" >/dev/null || { echo "ab-ch-img: $tool is not installed" >&2; exit 1; }
done
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
qemu-img create -q -f qcow2 "$dir/data.qcow2" 256M
"$b" bench -w -c 4096 -s 65536 -d 8 -f qcow2 "$dir/data.qcow2" >/dev/null
head -c 48M /dev/urandom | base64 -w0 | head -c 64M >"$dir/plain.raw"
qemu-img convert -c -O qcow2 -o compression_type=zstd -f raw "$dir/plain.raw" "$dir/zstd.qcow2"

case_args() {
    case $1 in
    randread-sync) echo "-c 100000 -d 32 --random -i sync -f qcow2 $dir/data.qcow2" ;;
    randwrite-sync) echo "-w -c 100000 -d 32 --random -i sync -f qcow2 $dir/data.qcow2" ;;
    zstd-read-sync) echo "-c 100000 -d 32 -i sync -f qcow2 $dir/zstd.qcow2" ;;
    randread-uring) echo "-c 100000 -d 32 --random -i io_uring -f qcow2 $dir/data.qcow2" ;;
    esac
}
out=$dir/runs.txt
: >"$out"
for _ in $(seq 1 "$rounds"); do
    for c in randread-sync randwrite-sync zstd-read-sync randread-uring; do
        for v in A B; do
            [ "$v" = A ] && bin=$a || bin=$b
            # shellcheck disable=SC2046 # the case's options are words
            ms=$(perf stat -x, -e task-clock "$bin" bench $(case_args "$c") 2>&1 >/dev/null |
                awk -F, '/task-clock/ {print $1}')
            echo "$c $v $ms" >>"$out"
        done
    done
done
python3 - "$out" "$rounds" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    case, v, ms = line.split()
    runs[case, v].append(float(ms))
print(f"| case (median of {sys.argv[2]}) | A ms | B ms | B vs A |")
print("| --- | --- | --- | --- |")
for case in dict.fromkeys(c for c, _ in runs):
    a, b = statistics.median(runs[case, "A"]), statistics.median(runs[case, "B"])
    print(f"| {case} | {a:.1f} | {b:.1f} | {100 * (b - a) / a:+.1f} % |")
PY
