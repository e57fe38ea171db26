#!/usr/bin/env bash
# Builds every fuzz target (a plain stable build: no sanitizer, no
# coverage instrumentation) and runs each once over its seed corpus, so the
# targets cannot rot and the seeds never crash them. Fuzzing itself is a
# separate, long run (docs/fuzzing.md).
#
#   fuzz/                  open_read, open_write  (seeds: fuzz/make-seeds.sh, qemu-img)
#   virtio-devices/fuzz/   request_parser         (seeds in git)
#   nbd/fuzz/              server_request_parser, client_reply_parser (seeds in git)
#
# Uses $FUZZ_TARGET_DIR (default target/fuzz) for both builds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target_dir=${FUZZ_TARGET_DIR:-$root/target/fuzz}

sh fuzz/make-seeds.sh >/dev/null
( cd fuzz && CARGO_TARGET_DIR="$target_dir" cargo build -q --bins )
( cd virtio-devices/fuzz && CARGO_TARGET_DIR="$target_dir" cargo build -q --bins )
( cd nbd/fuzz && CARGO_TARGET_DIR="$target_dir" cargo build -q --bins )

replay() { # target, seed files...
    local name=$1 log
    shift
    log=$(mktemp)
    # With file arguments libFuzzer runs each input once and exits
    # non-zero on a crash, an out-of-memory or a timeout.
    if ! "$target_dir/debug/$name" -timeout=60 -rss_limit_mb=2048 "$@" >"$log" 2>&1; then
        cat "$log"
        echo "fuzz-replay: $name crashed on its seeds" >&2
        exit 1
    fi
    echo "fuzz-replay: $name: $(grep -c '^Executed' "$log") seeds replayed"
    rm -f "$log"
}
seeds=(fuzz/corpus/open_read/*)
replay open_read "${seeds[@]}"
replay open_write "${seeds[@]}"
replay request_parser virtio-devices/fuzz/seeds/request_parser/*
replay server_request_parser nbd/fuzz/seeds/request_parser/*
replay client_reply_parser nbd/fuzz/seeds/reply_parser/*
