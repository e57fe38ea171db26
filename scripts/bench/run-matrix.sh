#!/bin/sh
# Builds the release bench tools (ch-img, blk-bench) and runs the benchmark
# matrix (scripts/bench/run-matrix.py): ours beside fio and qemu-img bench,
# interleaved and repeated, printed as markdown tables on stdout.
#
# Usage: scripts/bench/run-matrix.sh [--quick] [other run-matrix.py options]
# Needs: cargo, python3, fio, qemu-img (Debian: fio, qemu-utils).
# Images go to $BENCH_DIR (default /var/tmp/ch-bench, ~3 GiB).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
for tool in fio qemu-img python3; do
    command -v "$tool" >/dev/null || { echo "run-matrix: $tool is not installed" >&2; exit 1; }
done
(cd "$repo" && cargo build --release -p ch-img -p virtio-host-driver --bins) >&2
exec python3 "$here/run-matrix.py" --bin "$target/release" "$@"
