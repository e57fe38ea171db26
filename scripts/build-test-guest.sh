#!/usr/bin/env bash
# Builds the bare-metal virtio-blk test guest (tests/guest) if it is missing
# or older than its sources, and prints the absolute path of the ELF as the
# last line on stdout. Build output goes under tests/guest/build/.
# Needs gcc, ld (binutils) and make only; build logs go to stderr.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
guest="$repo/tests/guest"

for tool in make gcc ld; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build-test-guest: '$tool' not found (install: apt-get install -y build-essential)" >&2
        exit 1
    fi
done

# make decides staleness from the sources, headers, Makefile and linker script.
make -C "$guest" --no-print-directory >&2

echo "$guest/build/guest.elf"
