#!/bin/sh
# /init of the Linux test guest (packed by scripts/build-linux-guest.sh).
#
# Mounts proc, sys and devtmpfs, loads the virtio modules listed in
# /etc/chtest-modules, runs the steps named on the kernel command line on
# /dev/vda (and /dev/vdb for `ro`), prints one line per check on the
# console and powers off:
#   CHTEST result name=NAME status=ok|fail KEY=VALUE...
#   CHTEST done failures=N
#
# Kernel command line (read from /proc/cmdline; sizes and offsets in bytes):
#   chtest=STEP,STEP,...   steps in order: info ext4 fio irqs
#                          discard ro zero pattern expect
#   chtest.ext4_size=N     ext4 spans [0, N) of vda (64 MiB)
#   chtest.fio_off=N       fio region start (64 MiB); job j at +j*fio_size
#   chtest.fio_size=N      bytes per fio job (8 MiB)
#   chtest.fio_engines=E+E fio engines (libaio+io_uring)
#   chtest.fio_qds=Q+Q     iodepths (1+32)
#   chtest.fio_jobs=J+J    numjobs (1+2)
#   chtest.discard_off=N   8 MiB range for discard and write-zeroes (96 MiB)
#   chtest.zero=OFF:LEN/.. ranges zeroed with blkdiscard -z
#   chtest.pattern=OFF:LEN:BYTE/..  ranges filled with BYTE (dd, fsync)
#   chtest.expect=OFF:LEN:BYTE/..   ranges that must read back as BYTE
# A step that fails prints the reason in its result line; the guest still
# runs the remaining steps, prints the tail of dmesg and powers off.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys

FAILURES=0
DISK=/dev/vda
MiB=1048576

result() {
    echo "CHTEST result name=$1 status=$2 $3"
    [ "$2" = ok ] || FAILURES=$((FAILURES + 1))
}

# One line, no spaces: for error texts inside a result line.
squash() { tr -s ' \n\t' '___' | cut -c1-200; }

finish() {
    [ "$FAILURES" -eq 0 ] || dmesg | tail -n 40
    sync
    echo "CHTEST done failures=$FAILURES"
    poweroff -f
    sleep 10
}

for m in $(cat /etc/chtest-modules); do
    insmod "/lib/modules/$m.ko" || result "insmod-$m" fail ""
done

P_ext4_size=$((64 * MiB))
P_fio_off=$((64 * MiB))
P_fio_size=$((8 * MiB))
P_fio_engines=libaio+io_uring
P_fio_qds=1+32
P_fio_jobs=1+2
P_discard_off=$((96 * MiB))
P_zero=
P_pattern=
P_expect=
STEPS=
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    chtest=*) STEPS=$(echo "${arg#chtest=}" | tr ',' ' ') ;;
    chtest.*=*)
        key=${arg%%=*}
        key=${key#chtest.}
        case "$key" in
        *[!a-z0-9_]*) result "cmdline-$key" fail "reason=bad_key" ;;
        *) eval "P_$key=\${arg#*=}" ;;
        esac
        ;;
    esac
done

i=0
while [ ! -b $DISK ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
if [ ! -b $DISK ]; then
    result disk fail "reason=no_$DISK"
    finish
fi

# The largest dd block size (64 KiB, 4 KiB or 512) dividing both numbers.
blk() {
    for b in 65536 4096 512; do
        if [ $(($1 % b)) -eq 0 ] && [ $(($2 % b)) -eq 0 ]; then
            echo $b
            return
        fi
    done
    echo 512
}

# The md5 of LEN bytes of BYTE.
pattern_md5() {
    b=$(blk "$1" "$1")
    dd if=/dev/zero bs=$b count=$(($1 / b)) 2>/dev/null |
        tr '\000' "\\$(printf '%03o' $(($2)))" | md5sum | cut -d' ' -f1
}

# The md5 of LEN bytes of DEV at OFF, read with O_DIRECT.
read_md5() {
    b=$(blk "$2" "$3")
    dd if="$1" bs=$b skip=$(($2 / b)) count=$(($3 / b)) iflag=direct 2>/dev/null |
        md5sum | cut -d' ' -f1
}

# Writes LEN bytes of BYTE at OFF of the disk and fsyncs.
fill() {
    b=$(blk "$1" "$2")
    dd if=/dev/zero bs=$b count=$(($2 / b)) 2>/dev/null |
        tr '\000' "\\$(printf '%03o' $(($3)))" |
        dd of=$DISK bs=$b seek=$(($1 / b)) iflag=fullblock conv=fsync,notrunc 2>/tmp/dd.err
}

step_info() {
    dev=$(basename "$(readlink -f /sys/block/vda/device)")
    q=/sys/block/vda/queue
    result info ok "dev=$dev queues=$(ls /sys/block/vda/mq | wc -l) cpus=$(nproc) \
sectors=$(cat /sys/block/vda/size) ro=$(cat /sys/block/vda/ro) \
discard_max=$(cat $q/discard_max_bytes) write_zeroes_max=$(cat $q/write_zeroes_max_bytes) \
write_cache=$(cat $q/write_cache | tr ' ' '_')"
}

step_ext4() {
    if ! out=$(/usr/sbin/mkfs.ext4 -q -F $DISK $((P_ext4_size / 1024))k 2>&1); then
        result ext4-mkfs fail "err=$(echo "$out" | squash)"
        return
    fi
    mount -t ext4 $DISK /mnt || { result ext4-mount fail ""; return; }
    n=1
    while [ $n -le 16 ]; do
        dd if=/dev/urandom of=/mnt/f$n bs=4096 count=$((n * 8)) conv=fsync 2>/dev/null ||
            result ext4-write fail "file=f$n"
        n=$((n + 1))
    done
    (cd /mnt && md5sum f*) >/tmp/sums
    umount /mnt || result ext4-umount fail ""
    echo 3 >/proc/sys/vm/drop_caches
    if out=$(/usr/sbin/fsck.ext4 -fn $DISK 2>&1); then
        result ext4-fsck ok ""
    else
        result ext4-fsck fail "rc=$? out=$(echo "$out" | squash)"
    fi
    mount -t ext4 -o ro $DISK /mnt || { result ext4-remount fail ""; return; }
    if (cd /mnt && md5sum -c -s /tmp/sums); then
        result ext4-readback ok "files=16"
    else
        result ext4-readback fail ""
    fi
    umount /mnt
}

# All fio runs in one fio process (its start-up costs seconds under TCG):
# one stonewalled group per engine x iodepth x numjobs, each writing its
# region at random with crc32c verify headers and then reading it back
# (verify_fatal), then a group that only re-reads and verifies what the
# last group wrote. One result line per group from fio's terse output.
step_fio() {
    job=/tmp/fio.job
    printf '[global]\nfilename=%s\ndirect=1\nrw=randwrite\nbsrange=4k-64k\n' $DISK >$job
    printf 'verify=crc32c\nverify_fatal=1\ndo_verify=1\ngroup_reporting\n' >>$job
    printf 'offset=%s\nsize=%s\noffset_increment=%s\n' \
        "$P_fio_off" "$P_fio_size" "$P_fio_size" >>$job
    names=
    for engine in $(echo "$P_fio_engines" | tr '+' ' '); do
        for qd in $(echo "$P_fio_qds" | tr '+' ' '); do
            for jobs in $(echo "$P_fio_jobs" | tr '+' ' '); do
                name="fio-$engine-qd$qd-j$jobs"
                names="$names $name"
                printf '[%s]\nstonewall\nioengine=%s\niodepth=%s\nnumjobs=%s\n' \
                    "$name" "$engine" "$qd" "$jobs" >>$job
            done
        done
    done
    printf '[fio-reverify]\nstonewall\nioengine=%s\niodepth=%s\nnumjobs=%s\nverify_only=1\n' \
        "$engine" "$qd" "$jobs" >>$job
    names="$names fio-reverify"
    fio --output-format=terse --terse-version=3 $job >/tmp/fio.out 2>/tmp/fio.err
    rc=$?
    for name in $names; do
        line=$(grep "^3;[^;]*;$name;" /tmp/fio.out | tail -n 1)
        figures=$(echo "$line" | awk -F';' '{printf "err=%s read_kib=%s read_iops=%s write_kib=%s write_iops=%s", $5, $6, $8, $47, $49}')
        if [ -z "$line" ]; then
            result "$name" fail "reason=not_run fio_rc=$rc msg=$(head -c 300 /tmp/fio.err | squash)"
        elif [ "$(echo "$line" | cut -d';' -f5)" = 0 ]; then
            result "$name" ok "$figures"
        else
            result "$name" fail "$figures msg=$(head -c 300 /tmp/fio.err | squash)"
        fi
    done
    [ $rc -eq 0 ] || result fio-exit fail "rc=$rc msg=$(head -c 300 /tmp/fio.err | squash)"
}

# Interrupt counts of each of vda's queues (every queue must have taken some).
step_irqs() {
    dev=$(basename "$(readlink -f /sys/block/vda/device)")
    counts=$(grep "$dev-req" /proc/interrupts |
        awk '{s=0; for (i=2; i<=NF; i++) if ($i ~ /^[0-9]+$/) s+=$i; else break; printf "%s,", s}')
    case ",$counts" in
    *,0,* | ,) result irqs fail "per_queue=$counts" ;;
    *) result irqs ok "per_queue=$counts" ;;
    esac
}

step_discard() {
    off=$P_discard_off
    fill "$off" $((8 * MiB)) 0xa5 || { result discard-fill fail "err=$(squash </tmp/dd.err)"; return; }
    if out=$(/usr/sbin/blkdiscard -f -o "$off" -l $((4 * MiB)) $DISK 2>&1); then
        zeroed=no
        [ "$(read_md5 $DISK "$off" $((4 * MiB)))" = "$(pattern_md5 $((4 * MiB)) 0)" ] && zeroed=yes
        result discard ok "reads_zero=$zeroed"
    else
        result discard fail "err=$(echo "$out" | squash)"
    fi
    zoff=$((off + 4 * MiB))
    if out=$(/usr/sbin/blkdiscard -f -z -o "$zoff" -l $((4 * MiB)) $DISK 2>&1); then
        if [ "$(read_md5 $DISK "$zoff" $((4 * MiB)))" = "$(pattern_md5 $((4 * MiB)) 0)" ]; then
            result write-zeroes ok ""
        else
            result write-zeroes fail "reason=not_zero"
        fi
    else
        result write-zeroes fail "err=$(echo "$out" | squash)"
    fi
}

# vdb is a read-only export: the device says so (VIRTIO_BLK_F_RO, so the
# kernel marks the disk read-only), reads work and writes fail. The kernel
# refuses the write itself (EPERM) and `blockdev --setrw` cannot clear a
# disk-level read-only flag, so the device's own refusal is not reached.
# The ext4 filesystem on it mounts read-only and answers EROFS.
step_ro() {
    ro=/dev/vdb
    [ -b $ro ] || { result ro fail "reason=no_$ro"; return; }
    [ "$(cat /sys/block/vdb/ro)" = 1 ] && result ro-flag ok "" || result ro-flag fail "ro=$(cat /sys/block/vdb/ro)"
    if dd if=$ro of=/dev/null bs=4096 count=256 iflag=direct 2>/dev/null; then
        result ro-read ok ""
    else
        result ro-read fail ""
    fi
    if dd if=/dev/zero of=$ro bs=4096 count=1 conv=fsync,notrunc 2>/tmp/dd.err; then
        result ro-write fail "reason=write_succeeded"
    else
        err=$(squash </tmp/dd.err)
        case "$err" in
        *Read-only* | *not_permitted* | *Input/output* | *Permission_denied*) result ro-write ok "err=$err" ;;
        *) result ro-write fail "err=$err" ;;
        esac
    fi
    # vdb holds an ext4 filesystem with /chtest.txt = "chtest ro": a plain
    # mount must end up read-only, the file reads back, creating a file
    # fails with EROFS.
    mount -t ext4 $ro /mnt 2>/tmp/mount.err || { result ro-fs fail "err=$(squash </tmp/mount.err)"; return; }
    opts=$(awk '$1 == "/dev/vdb" {print $4}' /proc/mounts)
    content=$(cat /mnt/chtest.txt 2>/dev/null)
    if touch /mnt/new 2>/tmp/touch.err; then
        result ro-fs fail "reason=create_succeeded opts=$opts"
    else
        err=$(squash </tmp/touch.err)
        case "$opts,$content,$err" in
        ro*,"chtest ro",*Read-only*) result ro-fs ok "opts=$opts err=$err" ;;
        *) result ro-fs fail "opts=$opts content=$(echo "$content" | squash) err=$err" ;;
        esac
    fi
    umount /mnt
}

step_zero() {
    for r in $(echo "$P_zero" | tr '/' ' '); do
        off=${r%%:*} len=${r#*:}
        if out=$(/usr/sbin/blkdiscard -f -z -o "$off" -l "$len" $DISK 2>&1); then
            result "zero-$off" ok ""
        else
            result "zero-$off" fail "err=$(echo "$out" | squash)"
        fi
    done
}

step_pattern() {
    for r in $(echo "$P_pattern" | tr '/' ' '); do
        off=${r%%:*} rest=${r#*:}
        len=${rest%%:*} byte=${rest#*:}
        if fill "$off" "$len" "$byte"; then
            result "pattern-$off" ok ""
        else
            result "pattern-$off" fail "err=$(squash </tmp/dd.err)"
        fi
    done
}

step_expect() {
    echo 3 >/proc/sys/vm/drop_caches
    for r in $(echo "$P_expect" | tr '/' ' '); do
        off=${r%%:*} rest=${r#*:}
        len=${rest%%:*} byte=${rest#*:}
        if [ "$(read_md5 $DISK "$off" "$len")" = "$(pattern_md5 "$len" "$byte")" ]; then
            result "expect-$off" ok ""
        else
            result "expect-$off" fail "reason=content_differs"
        fi
    done
}

echo "CHTEST start steps=$(echo $STEPS | tr ' ' ',')"
for s in $STEPS; do
    case "$s" in
    info | ext4 | fio | irqs | discard | ro | zero | pattern | expect) "step_$s" ;;
    *) result "step-$s" fail "reason=unknown_step" ;;
    esac
done
finish
