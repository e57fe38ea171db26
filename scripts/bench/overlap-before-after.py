#!/usr/bin/env python3
# Interleaved before/after of the two writing rows of run-matrix (ch-img bench,
# 4 KiB random writes into an allocated image and allocating 64 KiB writes
# into an empty one) for two ch-img builds, each pair's order alternated;
# prints | row | new IOPS | old IOPS | median new/old | each pair's ratio |.
# Usage: CH_IMG_NEW=target/release/ch-img CH_IMG_OLD=/path/to/old/ch-img \
#        scripts/bench/overlap-before-after.py REPEATS [DIR]
import json, subprocess, statistics, sys, os
NEW = os.environ.get("CH_IMG_NEW", "target/release/ch-img")
OLD = os.environ["CH_IMG_OLD"]
d = sys.argv[2] if len(sys.argv) > 2 else "/var/tmp/ovl"
os.makedirs(d, exist_ok=True)
def sh(*a): subprocess.run(a, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if not os.path.exists(f"{d}/alloc.qcow2"):
    sh("qemu-img","create","-f","qcow2","-o","cluster_size=65536",f"{d}/alloc.qcow2","1G")
    sh("qemu-io","-f","qcow2","-c","write -P 0x5a 0 1G",f"{d}/alloc.qcow2")
def bench(bin, img, extra):
    out=subprocess.run([bin,"bench","-f","qcow2","-i","io_uring","-t","none"]+extra+["--output=json",img],check=True,capture_output=True,text=True).stdout
    return json.loads(out[out.index("{"):])["ops_per_sec"]
rows={"randwrite":{"new":[],"old":[]},"alloc":{"new":[],"old":[]}}
for r in range(int(sys.argv[1])):
    order=["new","old"] if r%2==0 else ["old","new"]
    for who in order:
        b=NEW if who=="new" else OLD
        rows["randwrite"][who].append(bench(b,f"{d}/alloc.qcow2",["-d","32","-s","4096","-c","200000","-w","--random"]))
        sh("qemu-img","create","-q","-f","qcow2","-o","cluster_size=65536",f"{d}/empty.qcow2","1G")
        rows["alloc"][who].append(bench(b,f"{d}/empty.qcow2",["-d","32","-s","65536","-c","8192","-w"]))
for k,v in rows.items():
    ratios=[n/o for n,o in zip(v["new"],v["old"])]
    print(f"| {k} | {statistics.median(v['new']):.0f} | {statistics.median(v['old']):.0f} | {statistics.median(ratios):.3f} | {', '.join(f'{x:.3f}' for x in ratios)} |")
