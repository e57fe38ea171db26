#!/bin/sh
# Makes the seed inputs of the open_read target in fuzz/corpus/open_read/
# (the folder is not in git: libFuzzer grows it): small qemu-img images
# with 512-byte clusters (empty, data and a zero cluster, compressed, two
# internal snapshots) and 16 KiB clusters with extended L2.
# Needs qemu-img and qemu-io (Debian: qemu-utils).
set -eu
dir=$(cd "$(dirname "$0")" && pwd)/corpus/open_read
mkdir -p "$dir"
cd "$dir"
rm -f plain.qcow2 data.qcow2 compressed.qcow2 ext.qcow2 snapshots-512.qcow2
qemu-img create -q -f qcow2 -o cluster_size=512 plain.qcow2 64k
qemu-img create -q -f qcow2 -o cluster_size=512 data.qcow2 64k
qemu-io -f qcow2 -c "write -P 0x11 0 4k" -c "write -z 8k 1k" data.qcow2 >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=512 compressed.qcow2 64k
qemu-io -f qcow2 -c "write -c -P 0x22 0 2k" compressed.qcow2 >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=16k,extended_l2=on ext.qcow2 256k
qemu-io -f qcow2 -c "write -P 0x33 2k 2k" ext.qcow2 >/dev/null
qemu-img create -q -f qcow2 -o cluster_size=512 snapshots-512.qcow2 64k
qemu-io -f qcow2 -c "write -P 0x11 0 4k" snapshots-512.qcow2 >/dev/null
qemu-img snapshot -c a snapshots-512.qcow2
qemu-io -f qcow2 -c "write -P 0x22 1k 1k" snapshots-512.qcow2 >/dev/null
qemu-img snapshot -c bb snapshots-512.qcow2
ls -l "$dir"
