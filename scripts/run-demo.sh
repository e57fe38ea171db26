#!/usr/bin/env bash
# The README's main job: build everything (release), make a qcow2 image,
# build the bare-metal test guest, boot it under cloud-hypervisor with
# `--disk path=...,num_queues=4`, print its serial report and the image's
# info afterwards. Exits non-zero unless the guest printed RESULT: PASS
# and the VMM exited cleanly.
#
# Environment: DEMO_DIR (default: a new temp dir, kept for inspection),
# DEMO_SIZE (default 256M), DEMO_TIMEOUT seconds (default 300),
# DEMO_PROFILE (release, the default, or debug for a quicker build).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

profile=${DEMO_PROFILE:-release}
echo "== building ($profile)"
if [ "$profile" = release ]; then
    cargo build --release --workspace --bins
else
    cargo build --workspace --bins
fi
target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
vmm="$target_dir/$profile/cloud-hypervisor"
chimg="$target_dir/$profile/ch-img"

work="${DEMO_DIR:-$(mktemp -d /tmp/ch-demo.XXXXXX)}"
mkdir -p "$work"
img="$work/disk.qcow2"
rm -f "$img"
echo "== creating $img"
"$chimg" create -f qcow2 "$img" "${DEMO_SIZE:-256M}"

echo "== building the test guest"
guest=$(scripts/build-test-guest.sh | tail -n 1)

echo "== booting $guest"
serial="$work/serial.log"
set +e
timeout "${DEMO_TIMEOUT:-300}" "$vmm" \
    --kernel "$guest" --cmdline "disks=1" \
    --cpus boot=1 --memory size=256M \
    --disk "path=$img,num_queues=4" \
    --serial "file=$serial" -v
rc=$?
set -e
echo "== serial output"
cat "$serial"
echo "== image after the run"
"$chimg" info "$img" || true
"$chimg" check "$img" || true

if [ "$rc" -ne 0 ]; then
    echo "run-demo: cloud-hypervisor exited with status $rc" >&2
    exit 1
fi
if ! grep -qx "RESULT: PASS" "$serial"; then
    echo "run-demo: the guest did not print RESULT: PASS" >&2
    exit 1
fi
echo "run-demo: PASS (files in $work)"
