# Shared by callgrind-ch-img.sh and callgrind-blk-bench.sh (sourced, not
# run): the images both measure, one callgrind run's instruction count,
# and the table of every binary and workload (`main`). The caller
# defines `command_for WORKLOAD BIN`, which sets the array `cmd` to the
# command one run of that workload is, then calls `main`.

# Requests per run, and runs per binary and workload.
count=20000
runs=${RUNS:-3}

# The images the workloads use, made once in $work:
#   $alloc  a 1 GiB qcow2 whose clusters are all allocated
#           (qemu-img create -o preallocation=falloc)
#   $comp   a 256 MiB compressed qcow2 (qemu-img convert -c of
#           compressible text)
# and the path of the fresh image each write-allocating run gets.
make_images() {
    alloc=$work/allocated.qcow2
    [ -f "$alloc" ] || qemu-img create -q -f qcow2 -o preallocation=falloc "$alloc" 1G
    comp=$work/compressed.qcow2
    if [ ! -f "$comp" ]; then
        seq 1 30000000 > "$work/text.raw"
        truncate -s 256M "$work/text.raw"
        qemu-img convert -q -c -O qcow2 "$work/text.raw" "$comp"
        rm -f "$work/text.raw"
    fi
    fresh=$work/fresh.qcow2
}

# A new empty 1 GiB qcow2 at $fresh (each write-allocating run gets one).
new_fresh_image() {
    rm -f "$fresh"
    qemu-img create -q -f qcow2 "$fresh" 1G
}

# instructions BIN ARGS...: total Ir of every thread of one run.
instructions() {
    local out=$work/callgrind.out
    rm -f "$out"*
    valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>"$work/valgrind.log" \
        || { cat "$work/valgrind.log" >&2; return 1; }
    sed -n 's/^summary: *//p' "$out" | awk '{s += $1} END {printf "%.0f\n", s}'
}

print_header() {
    printf '%-40s %-17s %14s %9s %11s  %s\n' binary workload instructions requests per-request runs
}

# print_row BIN WORKLOAD COUNT...: the median of the runs' counts, per
# request, then every run's count.
print_row() {
    local bin=$1 w=$2
    shift 2
    local ir
    ir=$(printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
    printf '%-40s %-17s %14s %9d %11.1f  %s\n' "$bin" "$w" "$ir" "$count" \
        "$(echo "$ir / $count" | bc -l)" "$*"
}

# run_all BIN...: the table, every workload of every binary measured
# $runs times (a write-allocating run on a fresh image each time).
run_all() {
    print_header
    local bin w all
    for bin in "$@"; do
        for w in read-allocated write-allocating read-compressed; do
            all=()
            for _ in $(seq "$runs"); do
                if [ "$w" = write-allocating ]; then
                    new_fresh_image
                fi
                command_for "$w" "$bin"
                all+=("$(instructions "${cmd[@]}")")
            done
            print_row "$bin" "$w" "${all[@]}"
        done
    done
}

# main USAGE WORKDIR BIN...: checks the arguments, makes the images in
# WORKDIR and prints the table.
main() {
    local usage=$1
    shift
    work=${1:?usage: $usage}
    shift
    [ $# -ge 1 ] || { echo "usage: $usage" >&2; exit 2; }
    mkdir -p "$work"
    make_images
    run_all "$@"
}
