#!/usr/bin/env bash
# Builds the Linux test guest: a Debian cloud kernel and an uncompressed
# initramfs holding busybox, fio (with every library it links), mkfs.ext4,
# fsck.ext4, blkdiscard, the virtio-blk modules and scripts/linux-guest-init.sh
# as /init (see docs/linux-guests.md for what /init runs).
#
#   scripts/build-linux-guest.sh
#
# Everything comes from the machine's Debian archive: missing packages are
# installed with apt-get (apt-get update first); the kernel package
# (linux-image-<version>-cloud-amd64, the version the
# linux-image-cloud-amd64 metapackage depends on) is fetched with
# `apt-get download` and unpacked with `dpkg-deb -x` into the cache, never
# installed (/boot is not touched).
#
# The result is cached under $CH_LINUX_GUEST_DIR (default
# target/linux-guest/) in a folder named after the package versions and a
# hash of this script and the init script, so a rerun only checks the
# versions. Progress goes to stderr; stdout gets exactly two lines:
#   CH_LINUX_KERNEL=<path of vmlinuz>
#   CH_LINUX_INITRAMFS=<path of initramfs.cpio>
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
init_script="$repo/scripts/linux-guest-init.sh"
cache_root=${CH_LINUX_GUEST_DIR:-$repo/target/linux-guest}

log() { echo "build-linux-guest: $*" >&2; }

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
apt_updated=0
apt_update() {
    if [ $apt_updated -eq 0 ]; then
        log "apt-get update"
        "${sudo_cmd[@]}" apt-get update -qq >&2
        apt_updated=1
    fi
}

# Tools on the host (qemu-system-x86 also brings qemu-storage-daemon) and
# the packages whose files go into the initramfs.
packages=(qemu-system-x86 qemu-utils busybox-static cpio fio e2fsprogs util-linux fdisk)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    apt_update
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >&2
fi

# The cloud kernel the metapackage currently points at.
kernel_pkg() {
    apt-cache depends linux-image-cloud-amd64 2>/dev/null |
        sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n 1
}
kpkg=$(kernel_pkg)
if [ -z "$kpkg" ]; then
    apt_update
    kpkg=$(kernel_pkg)
fi
[ -n "$kpkg" ] || { log "no linux-image-*-cloud-amd64 in the apt sources"; exit 1; }
kver_pkg=$(apt-cache policy "$kpkg" | sed -n 's/^ *Candidate: //p')
kabi=${kpkg#linux-image-}

version_of() { dpkg-query -W -f='${Version}' "$1"; }
key_text="$kpkg=$kver_pkg busybox-static=$(version_of busybox-static) fio=$(version_of fio)"
key_text+=" e2fsprogs=$(version_of e2fsprogs) util-linux=$(version_of util-linux)"
key_text+=" $(cat "$0" "$init_script" | sha256sum | cut -c1-16)"
key=$(echo "$key_text" | sha256sum | cut -c1-16)
out="$cache_root/$kabi-$key"

if [ ! -f "$out/initramfs.cpio" ] || [ ! -f "$out/vmlinuz" ]; then
    log "building $out ($key_text)"
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/deb" "$out.tmp/root"
    (cd "$out.tmp/deb" && apt-get download "$kpkg=$kver_pkg" >&2 2>/dev/null) || {
        apt_update
        (cd "$out.tmp/deb" && apt-get download "$kpkg=$kver_pkg" >&2)
    }
    dpkg-deb -x "$out.tmp/deb/"*.deb "$out.tmp/kernel"
    cp "$out.tmp/kernel/boot/vmlinuz-$kabi" "$out.tmp/vmlinuz"
    cp "$out.tmp/kernel/boot/config-$kabi" "$out.tmp/config"

    root="$out.tmp/root"
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,mnt,tmp,lib/modules}

    # busybox and a link per applet (the real tools below replace some).
    cp /bin/busybox "$root/bin/busybox"
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done

    # A binary and every library ldd lists, at the same paths.
    copy_with_libs() {
        local src=$1 dst=$2
        cp -L "$src" "$root$dst"
        ldd "$src" | grep -o '/[^ ]*' | while read -r lib; do
            [ -e "$root$lib" ] && continue
            mkdir -p "$root$(dirname "$lib")"
            cp -L "$lib" "$root$lib"
        done
    }
    copy_with_libs /usr/bin/fio /usr/bin/fio
    copy_with_libs /usr/sbin/mke2fs /usr/sbin/mkfs.ext4
    copy_with_libs /usr/sbin/e2fsck /usr/sbin/fsck.ext4
    copy_with_libs /usr/sbin/blkdiscard /usr/sbin/blkdiscard
    rm -f "$root/bin/blkdiscard"
    cp /etc/mke2fs.conf "$root/etc/mke2fs.conf"

    # The virtio modules, dependencies first (depends= from each module's
    # .modinfo; the kernel package ships no modules.dep).
    moddir="$out.tmp/kernel/lib/modules/$kabi"
    declare -A loaded=()
    order=()
    add_module() {
        local name=${1//-/_} file dep
        [ -n "${loaded[$name]:-}" ] && return 0
        file=$(find "$moddir" -name "$name.ko" -o -name "${name//_/-}.ko" | head -n 1)
        [ -n "$file" ] || { log "module $name not found in $kpkg"; exit 1; }
        for dep in $(tr '\0' '\n' <"$file" | sed -n 's/^depends=//p' | tr ',' ' '); do
            add_module "$dep"
        done
        loaded[$name]=1
        order+=("$name")
        cp "$file" "$root/lib/modules/$name.ko"
    }
    for m in virtio_pci virtio_blk; do add_module "$m"; done
    printf '%s\n' "${order[@]}" >"$root/etc/chtest-modules"
    log "modules: ${order[*]}"

    cp "$init_script" "$root/init"
    chmod 755 "$root/init"
    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
        cpio -o -H newc --owner=0:0 --quiet) >"$out.tmp/initramfs.cpio"
    echo "$key_text" >"$out.tmp/versions"
    rm -rf "$out.tmp/deb" "$out.tmp/kernel" "$out.tmp/root"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    # Older builds (other versions or scripts) in the cache go.
    find "$cache_root" -mindepth 1 -maxdepth 1 -type d ! -name "$(basename "$out")" \
        -exec rm -rf {} +
    log "initramfs $(du -m "$out/initramfs.cpio" | cut -f1) MiB"
else
    log "cached: $out"
fi

echo "CH_LINUX_KERNEL=$out/vmlinuz"
echo "CH_LINUX_INITRAMFS=$out/initramfs.cpio"
