#!/usr/bin/env bash
# The project's test command (README): installs what the tests need on a
# fresh machine, builds everything, then runs every test of the workspace.
#
# What it installs when missing: qemu-utils (qemu-img, qemu-io: the oracle
# the tests compare against), fio (the reference of the benchmarks),
# acpica-tools (iasl, which disassembles our ACPI tables in a test),
# qemu-system-x86 (the vhost-user-blk front end of the export tests),
# util-linux (fincore: page-cache residency; losetup/fallocate for the
# FUSE export's loop-device test), strace (counting flushes), fdisk and
# e2fsprogs (the FUSE export's ext4 test), curl (the API tests' client),
# nbdkit and libnbd-bin (the NBD export's and client's peers; nbdinfo
# also reads the dirty bitmaps qemu-nbd exports).
#
# CH_REQUIRE_ALL=1 (the default here) makes every test that needs a tool
# from outside the project fail instead of skipping when the tool is
# missing (testkit/src/lib.rs). At the end it prints how many tests ran.
set -euo pipefail
cd "$(dirname "$0")/.."
export CH_REQUIRE_ALL=${CH_REQUIRE_ALL:-1}

need_apt=()
command -v qemu-img >/dev/null 2>&1 || need_apt+=(qemu-utils)
command -v qemu-io >/dev/null 2>&1 || need_apt+=(qemu-utils)
command -v fio >/dev/null 2>&1 || need_apt+=(fio)
command -v iasl >/dev/null 2>&1 || need_apt+=(acpica-tools)
# QEMU as a vhost-user-blk front end (storage-daemon's vhost_user_qemu test).
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_apt+=(qemu-system-x86)
# qemu-storage-daemon holds an image open in ch-img's lock tests.
command -v qemu-storage-daemon >/dev/null 2>&1 || need_apt+=(qemu-system-common)
command -v fincore >/dev/null 2>&1 || need_apt+=(util-linux)
command -v strace >/dev/null 2>&1 || need_apt+=(strace)
# curl --unix-socket drives the VMM's API in tests/tests/e2e_api*.rs.
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# The FUSE export tests: sfdisk (fdisk), mkfs.ext4/fsck.ext4 (e2fsprogs),
# losetup (util-linux).
command -v sfdisk >/dev/null 2>&1 || need_apt+=(fdisk)
command -v mkfs.ext4 >/dev/null 2>&1 || need_apt+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || need_apt+=(util-linux)
# The NBD tests' peers: qemu-nbd, nbdkit (file and memory plugins),
# libnbd's nbdinfo/nbdcopy (and fio's nbd engine, which links libnbd);
# nbdinfo --map also reads the dirty bitmaps qemu-nbd exports
# (ch_img_bitmap, ch_img_amend).
command -v qemu-nbd >/dev/null 2>&1 || need_apt+=(qemu-utils)
command -v nbdkit >/dev/null 2>&1 || need_apt+=(nbdkit)
command -v nbdinfo >/dev/null 2>&1 || need_apt+=(libnbd-bin)
command -v nbdcopy >/dev/null 2>&1 || need_apt+=(libnbd-bin)
# nbdsh (libnbd's Python binding): e2e_disk_backup's incremental loop.
command -v nbdsh >/dev/null 2>&1 || need_apt+=(python3-libnbd)
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

# The Linux test guest of tests/tests/linux_guest.rs (a Debian cloud kernel
# and an initramfs with fio; cached under target/linux-guest/). The script
# apt-installs QEMU, busybox-static, fio, e2fsprogs, util-linux when missing.
if linux_guest=$(scripts/build-linux-guest.sh); then
    CH_LINUX_KERNEL=$(sed -n 's/^CH_LINUX_KERNEL=//p' <<<"$linux_guest")
    CH_LINUX_INITRAMFS=$(sed -n 's/^CH_LINUX_INITRAMFS=//p' <<<"$linux_guest")
    export CH_LINUX_KERNEL CH_LINUX_INITRAMFS
    echo "run-tests: Linux guest at $CH_LINUX_KERNEL $CH_LINUX_INITRAMFS"
elif [ "$CH_REQUIRE_ALL" = 1 ]; then
    echo "run-tests: scripts/build-linux-guest.sh failed" >&2
    exit 1
fi

# The small Linux kernel and the SSE-free /init that boot under our own
# cloud-hypervisor here (tests/tests/e2e_linux_own_vmm.rs): built once from
# Debian's linux-source and cached under target/linux-kernel/ (a few
# minutes on 2 cores the first time), /init with make.
if own_kernel=$(scripts/build-linux-kernel.sh); then
    CH_OWN_LINUX_KERNEL=$(sed -n 's/^CH_OWN_LINUX_KERNEL=//p' <<<"$own_kernel")
    export CH_OWN_LINUX_KERNEL
    echo "run-tests: own Linux kernel at $CH_OWN_LINUX_KERNEL"
elif [ "$CH_REQUIRE_ALL" = 1 ]; then
    echo "run-tests: scripts/build-linux-kernel.sh failed" >&2
    exit 1
fi
make -C tests/linux-init --no-print-directory >&2
export CH_LINUX_INIT_CPIO="$PWD/tests/linux-init/build/initramfs.cpio"

# Binaries first: the integration tests run ch-img and cloud-hypervisor.
cargo build --workspace --bins
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export CH_BIN_DIR="$target_dir/debug"

# The fuzz targets build and replay their seeds (they are separate cargo
# workspaces, so `cargo test --workspace` does not see them).
scripts/fuzz-replay.sh

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
# One line with the totals of every test binary ("test result: ok. N
# passed; M failed; K ignored; ...").
python3 - "$log" <<'PY'
import re, sys
totals = [0, 0, 0]
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", line)
    if m:
        for i in range(3):
            totals[i] += int(m.group(i + 1))
print(f"run-tests: {totals[2]} ignored (benchmark programs and child processes)")
print(f"run-tests: {totals[0]} passed, {totals[1]} failed")
PY
exit "$status"
