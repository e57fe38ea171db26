#!/usr/bin/env python3
"""Interleaved A/B of FUSE export variants: fio randrw 70/30 bs=4k
O_DIRECT (io_uring) on the exported file of one image, the same job as
fuse-export.py, with more rounds and freer backends, for questions the
matrix does not ask (another binary, other --image keys, an environment
variable). Each round runs every backend once per cell, in an order
rotated per round; the table quotes medians and every round's MiB/s.

A backend is NAME=SPEC. SPEC is `qsd` (qemu-storage-daemon's FUSE
export, cache.direct=on,aio=io_uring), `fio-file` (fio on the image
file's own data, fuse-export.py's file_target) or `BIN` followed by
`;`-separated fields: `export=KEYS` (added to --export
type=fuse,...), `image=KEYS` (added to --image path=...,direct=on),
`env=NAME=VALUE` (`{image}` in VALUE is the image's path). Example:

    scripts/bench/fuse-ab.py --cells 1x1 --rounds 8 --ref qsd \\
        main=target/release/ch-storage-daemon \\
        aio='target/release/ch-storage-daemon;image=engine=aio' qsd=qsd file=fio-file

Data enters as the image fuse-export.py makes and fio's JSON; it leaves
as markdown on stdout (each run on stderr). Needs root (mounts,
enable_uring, which it restores).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
fe = __import__("fuse-export")


def backend(spec, image, fmt, mountpoint):
    """(argv or None, extra environment) of one SPEC."""
    if spec == "qsd":
        return fe.qsd_argv(image, fmt, mountpoint), {}
    if spec == "fio-file":
        return None, {}
    fields = spec.split(";")
    export, image_keys, env = "", "", {}
    for field in fields[1:]:
        key, _, value = field.partition("=")
        if key == "export":
            export = value
        elif key == "image":
            image_keys = value
        elif key == "env":
            name, _, val = value.partition("=")
            env[name] = val.replace("{image}", image)
        else:
            raise SystemExit(f"unknown field '{key}' in '{spec}'")
    return fe.ours_argv(fields[0], image, fmt, mountpoint, export, image_keys), env


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="/var/tmp/ch-fuse-ab")
    p.add_argument("--size", type=int, default=1 << 30)
    p.add_argument("--format", default="raw")
    p.add_argument("--cells", default="1x1")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--ref", help="backend the ratio column divides by")
    p.add_argument("backends", nargs="+", metavar="NAME=SPEC")
    args = p.parse_args()
    args.formats = [args.format]
    os.makedirs(args.dir, exist_ok=True)
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    results = {}
    with fe.uring_enabled():
        image = fe.make_images(args)[args.format]
        mountpoint = os.path.join(args.dir, "export")
        open(mountpoint, "a").close()
        variants = []
        for item in args.backends:
            name, _, spec = item.partition("=")
            variants.append((name, *backend(spec, image, args.format, mountpoint)))
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for cell in cells:
                for name, argv, env in order:
                    with fe.Daemon(name, argv, mountpoint if argv else None, env):
                        target, extra = (mountpoint, []) if argv else fe.file_target(image)
                        f = fe.fio(target, cell[0], cell[1], args, extra)
                    mib = f["read_mib"] + f["write_mib"]
                    results.setdefault((cell, name), []).append(
                        (mib, f["read_lat_us"], f["write_lat_us"]))
                    fe.log(f"{cell} {name} round {r}: {mib:.1f} MiB/s, "
                           f"read lat {f['read_lat_us']:.0f} us, write lat {f['write_lat_us']:.0f} us")
    print(f"fio randrw 70/30 bs=4k direct=1 io_uring, {args.format} image of {args.size} bytes, "
          f"{args.seconds} s per run, {args.rounds} interleaved rounds, medians\n")
    ref = f" | / {args.ref}" if args.ref else ""
    print(f"| jobs,depth | backend | MiB/s | read lat us | write lat us{ref} | every round, MiB/s |")
    print("| --- | --- | --- | --- | ---" + (" | ---" if args.ref else "") + " | --- |")
    for cell in cells:
        base = statistics.median(x[0] for x in results[(cell, args.ref)]) if args.ref else None
        for name, _, _ in variants:
            runs = results[(cell, name)]
            mib = statistics.median(x[0] for x in runs)
            ratio = f" | {mib / base:.2f}" if base else ""
            print(f"| {cell[0]},{cell[1]} | {name} | {mib:.1f} | "
                  f"{statistics.median(x[1] for x in runs):.0f} | "
                  f"{statistics.median(x[2] for x in runs):.0f}{ratio} | "
                  + " ".join(f"{x[0]:.0f}" for x in runs) + " |")


if __name__ == "__main__":
    main()
