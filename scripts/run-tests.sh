#!/usr/bin/env bash
# The project's test command (README): installs what the tests need on a
# fresh machine, builds everything, then runs every test of the workspace.
#
# What it installs when missing: qemu-utils (qemu-img, qemu-io: the oracle
# the tests compare against), fio (the reference of the benchmarks),
# acpica-tools (iasl, which disassembles our ACPI tables in a test) and
# fdisk, e2fsprogs, util-linux (the FUSE export's loop-device ext4 test).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v qemu-img >/dev/null 2>&1 || need_apt+=(qemu-utils)
command -v qemu-io >/dev/null 2>&1 || need_apt+=(qemu-utils)
command -v fio >/dev/null 2>&1 || need_apt+=(fio)
command -v iasl >/dev/null 2>&1 || need_apt+=(acpica-tools)
# The FUSE export tests: sfdisk (fdisk), mkfs.ext4/fsck.ext4 (e2fsprogs),
# losetup/fallocate (util-linux).
command -v sfdisk >/dev/null 2>&1 || need_apt+=(fdisk)
command -v mkfs.ext4 >/dev/null 2>&1 || need_apt+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || need_apt+=(util-linux)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "run-tests: installing ${need_apt[*]}"
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
qemu-img --version | head -1

# The bare-metal test guest the end-to-end tests boot (built from source).
if [ -x scripts/build-test-guest.sh ]; then
    CH_TEST_GUEST=$(scripts/build-test-guest.sh | tail -n 1)
    export CH_TEST_GUEST
    echo "run-tests: test guest at $CH_TEST_GUEST"
fi

# Binaries first: the integration tests run ch-img and cloud-hypervisor.
cargo build --workspace --bins
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export CH_BIN_DIR="$target_dir/debug"

cargo test --workspace "$@"
