#!/usr/bin/env bash
# What the best possible FUSE daemon reaches at queue depth 1 on this
# machine, beside ours and qemu-storage-daemon, in one interleaved run.
#
# "Ideal" is our daemon with fuse-ideal-sync.patch applied in a scratch
# worktree of HEAD: READ and WRITE are served by a blocking O_DIRECT
# pread/pwrite in the /dev/fuse thread that read the request, answered at
# once. That is the least work any daemon can put between a FUSE request
# and the disk (no engine, no ring, no eventfd, no epoll wake-up), so its
# ratio over qemu-storage-daemon bounds what a daemon can reach here. The
# patch is a measuring tool, never the product: a thread blocked in image
# I/O takes no other request, which the export must never do.
#
# "ideal-uring" is the same daemon with each transfer put on the thread's
# own io_uring and waited for there (CH_IDEAL_SYNC_ENGINE=uring): it pays
# what any asynchronous I/O pays in the kernel (the completion's task
# work, and for O_DIRECT writes the file system's completion workqueue)
# and nothing of an event loop. A daemon that never waits for its own
# I/O (the export's rule) pays at least that, plus its event loop.
#
# Usage: scripts/bench/fuse-ideal-bound.sh [ROUNDS] [CELLS]   (default 8 1x1)
# Raw images only: the patch reads and writes the image file as the guest
# view. CELLS: depth-1 cells (JOBSx1, comma-separated).
# Needs root; builds two release binaries (nothing else may run beside
# the measurement, so the builds come first).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-8}
cells=${2:-1x1}
scratch=$(mktemp -d /var/tmp/ch-ideal-XXXXXX)
target=${CH_BENCH_TARGET:-/var/tmp/ch-ideal-target}
cleanup() { git worktree remove --force "$scratch/tree" >/dev/null 2>&1 || true; rm -rf "$scratch"; }
trap cleanup EXIT

git worktree add -q --detach "$scratch/tree" HEAD
git -C "$scratch/tree" apply "$PWD/scripts/bench/fuse-ideal-sync.patch"
CARGO_TARGET_DIR="$target/ideal" cargo build -q --release -p storage-daemon \
    --manifest-path "$scratch/tree/Cargo.toml"
CARGO_TARGET_DIR="$target/main" cargo build -q --release -p storage-daemon
main="$target/main/release/ch-storage-daemon"
ideal="$target/ideal/release/ch-storage-daemon"

# One run per cell: the ideal daemon blocks one thread per request, so it
# gets one queue thread per fio job (at depth 1, one thread per request
# in flight); ours keeps the matrix's num_queues=2.
for cell in ${cells//,/ }; do
    jobs=${cell%x*}
    python3 scripts/bench/fuse-ab.py --cells "$cell" --rounds "$rounds" --ref qsd \
        "ours=$main;export=num_queues=2" \
        "ideal-sync=$ideal;export=num_queues=$jobs;env=CH_IDEAL_SYNC_IMAGE={image}" \
        "ideal-uring=$ideal;export=num_queues=$jobs;env=CH_IDEAL_SYNC_IMAGE={image};env=CH_IDEAL_SYNC_ENGINE=uring" \
        qsd=qsd fio-file=fio-file
done
