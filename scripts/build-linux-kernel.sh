#!/usr/bin/env bash
# Builds the small Linux kernel that boots under our cloud-hypervisor on
# the development machines (docs/linux-guests.md): Debian's linux-source
# package, configured with `make allnoconfig` plus
# tests/linux-init/kernel.config (PVH, ACPI, virtio-pci with MSI-X,
# virtio-blk, devtmpfs, the 8250 console; no modules, no crypto, no
# networking), built as an uncompressed vmlinux (entered through PVH),
# with the patches in tests/linux-init/*.patch applied (see the docs for
# why each is there).
#
#   scripts/build-linux-kernel.sh
#
# Installs what is missing with apt-get (the linux-source package the
# `linux-source` metapackage points at, gcc, make, bc, flex, bison,
# libelf-dev for objtool). The source is unpacked once under the cache and
# built out of tree, so a changed config rebuilds only what changed.
#
# The result is cached under $CH_LINUX_KERNEL_DIR (default
# target/linux-kernel/) in a folder named after the kernel version and a
# hash of this script and the config; a rerun only compares versions.
# Progress goes to stderr; stdout gets one line:
#   CH_OWN_LINUX_KERNEL=<path of vmlinux>
# Environment: JOBS (default: the number of CPUs).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="$repo/tests/linux-init/kernel.config"
patches=("$repo"/tests/linux-init/*.patch)
cache_root=${CH_LINUX_KERNEL_DIR:-$repo/target/linux-kernel}
jobs=${JOBS:-$(nproc)}

log() { echo "build-linux-kernel: $*" >&2; }

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
apt_updated=0
apt_install() {
    if [ $apt_updated -eq 0 ]; then
        log "apt-get update"
        "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
        apt_updated=1
    fi
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 \
        install -y -qq "$@" >&2
}

# The linux-source-X.Y package the metapackage depends on.
source_pkg() {
    apt-cache depends linux-source 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-source-[0-9.]*\)$/\1/p' | head -n 1
}
spkg=$(source_pkg)
if [ -z "$spkg" ]; then
    apt_install linux-source >/dev/null 2>&1 || true
    spkg=$(source_pkg)
fi
[ -n "$spkg" ] || { log "no linux-source package in the apt sources"; exit 1; }

missing=()
for p in "$spkg" gcc make bc flex bison libelf-dev xz-utils patch; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

sversion=$(dpkg-query -W -f='${Version}' "$spkg")
tarball=$(dpkg -L "$spkg" | grep -E '/usr/src/linux-source-[0-9.]+\.tar\.xz$' | head -n 1)
[ -f "$tarball" ] || { log "$spkg has no source tarball"; exit 1; }
key=$(cat "$0" "$config" "${patches[@]}" | sha256sum | cut -c1-16)
patches_key=$(cat "${patches[@]}" | sha256sum | cut -c1-16)
out="$cache_root/${spkg#linux-source-}-$sversion-$key"

if [ -f "$out/vmlinux" ]; then
    log "cached: $out"
    echo "CH_OWN_LINUX_KERNEL=$out/vmlinux"
    exit 0
fi

# The source, unpacked and patched once per package version and patch set
# (about 1.3 GB).
src="$cache_root/src-$sversion"
obj="$cache_root/obj-$sversion"
if [ "$(cat "$src/.unpacked" 2>/dev/null)" != "$patches_key" ]; then
    # Unpacked files keep the tarball's old times: objects built from other
    # patches would look newer than them, so they go too.
    rm -rf "$src" "$obj"
    mkdir -p "$src"
    log "unpacking $tarball"
    start=$SECONDS
    tar -xJf "$tarball" -C "$src" --strip-components=1
    for p in "${patches[@]}"; do
        log "applying $(basename "$p")"
        patch -s -p1 -d "$src" <"$p" >&2
    done
    echo "$patches_key" >"$src/.unpacked"
    log "unpacked in $((SECONDS - start)) s"
fi

mkdir -p "$obj"
start=$SECONDS
make -s -C "$src" O="$obj" allnoconfig KCONFIG_ALLCONFIG="$config" >&2
# Every option the fragment names must have survived (a dependency that is
# off silently turns an option off).
bad=0
while IFS= read -r line; do
    case "$line" in
    CONFIG_*=y)
        grep -qx "$line" "$obj/.config" || { log "not set: $line"; bad=1; } ;;
    CONFIG_*=n)
        ! grep -q "^${line%=n}=" "$obj/.config" || { log "still set: ${line%=n}"; bad=1; } ;;
    CONFIG_*=*)
        grep -qx "$line" "$obj/.config" || { log "not set: $line"; bad=1; } ;;
    esac
done <"$config"
[ $bad -eq 0 ] || { log "the config fragment does not apply to $spkg $sversion"; exit 1; }

log "building vmlinux ($spkg $sversion, $jobs jobs)"
make -s -C "$src" O="$obj" -j"$jobs" vmlinux >&2
log "built in $((SECONDS - start)) s"

rm -rf "$out.tmp"
mkdir -p "$out.tmp"
cp "$obj/vmlinux" "$obj/.config" "$out.tmp/"
echo "$spkg=$sversion" >"$out.tmp/version"
rm -rf "$out"
mv "$out.tmp" "$out"
# Only the result stays: the unpacked source and the object tree (1.6 GB
# together) go, as do older results (other versions or configs); a later
# config change unpacks the tarball again.
find "$cache_root" -mindepth 1 -maxdepth 1 -type d \
    ! -name "$(basename "$out")" -exec rm -rf {} +
log "vmlinux $(du -m "$out/vmlinux" | cut -f1) MiB"
echo "CH_OWN_LINUX_KERNEL=$out/vmlinux"
