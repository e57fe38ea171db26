#!/usr/bin/env bash
# convert -c to qcow2 with -t none and -t writeback: ch-img against
# qemu-img, on a source filled with ones and on a "real disk" mix
# (incompressible, compressible text and zero regions), zlib and zstd.
# Interleaved repeats; prints the median seconds and the page cache each
# run left behind for the output (fincore), and checks every output with
# qemu-img check and qemu-img compare. "ch-nocache" is ch-img with
# --compressed-cache=0 (one write per compressed cluster): whether the
# cache also pays off for buffered (-t writeback) targets.
#
# Then prints the issue's ratios per row: ch-img -t none / ch-img -t
# writeback (target <= 1.2) and qemu-img / ch-img with the same -t
# (target >= 2), medians of the per-repeat times, plus CPU seconds (user +
# system) per run, which noise changes less than wall time.
#
# usage: scripts/bench/convert-compressed.sh [SIZE_MIB=1000] [REPEATS=3] [DIR=/var/tmp/ch-bench]
# One row or a few: SOURCES="mix" COMPS="zstd" MODES="writeback" (each
# defaults to all: "ones mix", "zlib zstd", "none writeback"), e.g.
#   SOURCES=mix COMPS=zstd scripts/bench/convert-compressed.sh 1000 5
# The real run needs a quiet machine and root (drop_caches): with the
# defaults it takes about 8 minutes (2 repeats took 5.3 minutes on
# 2026-11-24). A smoke run (seconds): ... 8 1 /var/tmp/ch-smoke
set -euo pipefail
size_mib=${1:-1000}
repeats=${2:-3}
dir=${3:-/var/tmp/ch-bench}
sources=${SOURCES:-ones mix}
comps=${COMPS:-zlib zstd}
modes=${MODES:-none writeback}
root=$(cd "$(dirname "$0")/../.." && pwd)
for tool in /usr/bin/time bc fincore qemu-img python3; do
  command -v "$tool" > /dev/null || { echo "$0: needs $tool (apt-get install time bc util-linux qemu-utils python3)" >&2; exit 1; }
done
cargo build --quiet --release -p ch-img --manifest-path "$root/Cargo.toml"
target=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
chimg="$target/release/ch-img"
mkdir -p "$dir"

python3 - "$dir" "$size_mib" $sources <<'PY'
import os, sys
d, mib, wanted = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
if "ones" in wanted:
    with open(f"{d}/ones.raw", "wb") as f:
        block = b"\x01" * (1 << 20)
        for _ in range(mib):
            f.write(block)
text = b"".join(b"%08d the quick brown fox jumps over the lazy dog\n" % i for i in range(30000))[: 1 << 20]
if "mix" in wanted:
    with open(f"{d}/mix.raw", "wb") as f:
        for i in range(mib):
            k = i % 4
            f.write(os.urandom(1 << 20) if k == 0 else text if k in (1, 2) else b"\0" * (1 << 20))
PY

started=$(date +%s)
results="$dir/results.tsv"
: > "$results"
for r in $(seq "$repeats"); do
  for src in $sources; do
    for comp in $comps; do
      for mode in $modes; do
        for tool in ch-img ch-nocache qemu-img; do
          out="$dir/out.qcow2"
          rm -f "$out"
          case $tool in
            ch-img) cmd=("$chimg" convert) ;;
            ch-nocache) cmd=("$chimg" convert --compressed-cache=0) ;;
            *) cmd=(qemu-img convert) ;;
          esac
          sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
          /usr/bin/time -f '%e %U %S' -o "$dir/time.txt" \
            "${cmd[@]}" -c -O qcow2 -o compression_type=$comp -t $mode "$dir/$src.raw" "$out"
          read -r wall user sys < "$dir/time.txt"
          res=$(fincore --bytes --noheadings --output RES "$out")
          qemu-img check -q "$out"
          qemu-img compare -q -f raw -F qcow2 "$dir/$src.raw" "$out"
          printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$src" "$comp" "$mode" "$tool" \
            "$wall" "$(echo "$user + $sys" | bc)" "$res" >> "$results"
        done
      done
    done
  done
done

python3 - "$results" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    r, src, comp, mode, tool, wall, cpu, res = line.split("\t")
    runs[(src, comp, mode, tool)].append((int(r), float(wall), float(cpu), int(res)))
med = lambda xs: statistics.median(xs)
print(f"{'source':6} {'comp':5} {'-t':10} {'tool':11} {'median_s':>9} {'cpu_s':>7} {'page_cache_MiB':>15}")
for key in sorted(runs):
    v = runs[key]
    print(f"{key[0]:6} {key[1]:5} {key[2]:10} {key[3]:11} {med([x[1] for x in v]):9.2f} "
          f"{med([x[2] for x in v]):7.2f} {med([x[3] for x in v]) / 2**20:15.1f}")
def ratio(a, b):
    # Median of per-repeat ratios (a and b ran in the same repeat).
    ta = {x[0]: x[1] for x in runs.get(a, [])}
    tb = {x[0]: x[1] for x in runs.get(b, [])}
    rs = [ta[r] / tb[r] for r in ta if r in tb and tb[r] > 0]
    return f"{med(rs):.2f}" if rs else "-"
print()
print(f"{'source':6} {'comp':5} {'none/writeback (<=1.2)':>23} {'qemu/ch none (>=2)':>19} {'qemu/ch writeback (>=2)':>24}")
for src in ("ones", "mix"):
    for comp in ("zlib", "zstd"):
        k = lambda mode, tool: (src, comp, mode, tool)
        print(f"{src:6} {comp:5} {ratio(k('none', 'ch-img'), k('writeback', 'ch-img')):>23} "
              f"{ratio(k('none', 'qemu-img'), k('none', 'ch-img')):>19} "
              f"{ratio(k('writeback', 'qemu-img'), k('writeback', 'ch-img')):>24}")
PY
echo "raw results: $results; $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s"
