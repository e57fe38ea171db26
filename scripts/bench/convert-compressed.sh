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
# usage: scripts/bench/convert-compressed.sh [SIZE_MIB=1000] [REPEATS=5] [DIR=/var/tmp/ch-bench]
# Needs a quiet machine for the real run; a smoke run: ... 8 1
set -euo pipefail
size_mib=${1:-1000}
repeats=${2:-5}
dir=${3:-/var/tmp/ch-bench}
root=$(cd "$(dirname "$0")/../.." && pwd)
cargo build --quiet --release -p ch-img --manifest-path "$root/Cargo.toml"
target=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
chimg="$target/release/ch-img"
mkdir -p "$dir"

python3 - "$dir" "$size_mib" <<'PY'
import os, sys
d, mib = sys.argv[1], int(sys.argv[2])
with open(f"{d}/ones.raw", "wb") as f:
    block = b"\x01" * (1 << 20)
    for _ in range(mib):
        f.write(block)
text = b"".join(b"%08d the quick brown fox jumps over the lazy dog\n" % i for i in range(30000))[: 1 << 20]
with open(f"{d}/mix.raw", "wb") as f:
    for i in range(mib):
        k = i % 4
        f.write(os.urandom(1 << 20) if k == 0 else text if k in (1, 2) else b"\0" * (1 << 20))
PY

declare -A times cached
for r in $(seq "$repeats"); do
  for src in ones mix; do
    for comp in zlib zstd; do
      for mode in none writeback; do
        for tool in ch-img ch-nocache qemu-img; do
          out="$dir/out.qcow2"
          rm -f "$out"
          case $tool in
            ch-img) cmd=("$chimg" convert) ;;
            ch-nocache) cmd=("$chimg" convert --compressed-cache=0) ;;
            *) cmd=(qemu-img convert) ;;
          esac
          sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
          start=$(date +%s.%N)
          "${cmd[@]}" -c -O qcow2 -o compression_type=$comp -t $mode "$dir/$src.raw" "$out"
          end=$(date +%s.%N)
          res=$(fincore --bytes --noheadings --output RES "$out")
          qemu-img check -q "$out"
          qemu-img compare -q -f raw -F qcow2 "$dir/$src.raw" "$out"
          key="$src $comp $mode $tool"
          times[$key]+="$(echo "$end - $start" | bc) "
          cached[$key]+="$res "
        done
      done
    done
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf '%-5s %-5s %-10s %-10s %10s %14s\n' source comp cache tool median_s page_cache_MiB
for key in "${!times[@]}"; do
  t=$(echo "${times[$key]}" | median)
  c=$(echo "${cached[$key]}" | median)
  set -- $key
  printf '%-5s %-5s %-10s %-10s %10.2f %14.1f\n' "$1" "$2" "$3" "$4" "$t" "$(echo "$c / 1048576" | bc -l)"
done | sort
