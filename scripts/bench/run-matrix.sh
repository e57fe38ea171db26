#!/bin/sh
# Builds the release bench tools (ch-img, blk-bench) and runs the benchmark
# matrix (scripts/bench/run-matrix.py): ours beside fio and qemu-img bench,
# interleaved and repeated, printed as markdown tables on stdout.
#
# Usage: scripts/bench/run-matrix.sh [--quick] [--baseline-rev REV]
#                                    [other run-matrix.py options]
# Needs: cargo, python3, fio, qemu-img (Debian: fio, qemu-utils).
# Images go to $BENCH_DIR (default /var/tmp/ch-bench, ~3 GiB).
#
# --baseline-rev REV (before/after): also builds the git revision REV in a
# detached worktree ($BASELINE_SRC, default /var/tmp/ch-bench-baseline/src;
# its own target dir beside it) and passes its release folder as
# --baseline-bin, so every case runs "base" beside "ours" in the same
# rotation. blk-bench lives in virtio-host-driver (older trees:
# virtio-devices); the build picks whichever the revision has.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
for tool in fio qemu-img python3; do
    command -v "$tool" >/dev/null || { echo "run-matrix: $tool is not installed" >&2; exit 1; }
done

# The package that holds the blk-bench binary in the tree at $1.
bench_pkg() {
    if [ -f "$1/virtio-host-driver/Cargo.toml" ]; then
        echo virtio-host-driver
    else
        echo virtio-devices
    fi
}

baseline_rev=
n=$#
while [ "$n" -gt 0 ]; do
    arg=$1
    shift
    n=$((n - 1))
    if [ "$arg" = --baseline-rev ]; then
        [ "$n" -gt 0 ] || { echo "run-matrix: --baseline-rev needs a revision" >&2; exit 1; }
        baseline_rev=$1
        shift
        n=$((n - 1))
    else
        set -- "$@" "$arg"
    fi
done

(cd "$repo" && cargo build --release -p ch-img -p "$(bench_pkg "$repo")" --bins) >&2

if [ -n "$baseline_rev" ]; then
    src=${BASELINE_SRC:-/var/tmp/ch-bench-baseline/src}
    base_target=$(dirname "$src")/target
    rev=$(git -C "$repo" rev-parse --verify "$baseline_rev^{commit}")
    if [ -d "$src" ]; then
        git -C "$src" checkout -q --detach "$rev"
    else
        mkdir -p "$(dirname "$src")"
        git -C "$repo" worktree add -q --detach "$src" "$rev"
    fi
    echo "run-matrix: baseline $baseline_rev ($rev) in $src" >&2
    (cd "$src" && CARGO_TARGET_DIR=$base_target \
        cargo build --release -p ch-img -p "$(bench_pkg "$src")" --bins) >&2
    set -- --baseline-bin "$base_target/release" "$@"
fi
exec python3 "$here/run-matrix.py" --bin "$target/release" "$@"
