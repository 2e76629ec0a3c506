#!/usr/bin/env bash
# The whole GPU check of a host, in one go (a few minutes): `rdaq check`, `rdaq bench gpu`,
# the GPU graph's files against the CPU graph's (twice each, and each backend against
# itself), `rdaq run` at 1 kHz on both backends, and `rdaq bench pipeline` on the GPU (JF4M
# frames) and on the CPU (the scaling tables). RDAQ is the binary (default: the `rdaq` of the
# bundle this script came in, `make dist`); results go to OUT (default ./gpu-check-out), one
# file per step, with each step's status in OUT/steps.txt.
#
#   bench/gpu_device.sh [RDAQ [OUT]]
set -u
here=$(cd "$(dirname "$0")" && pwd)
R=$(realpath "${1:-$here/../rdaq}")
OUT=${2:-${OUT:-./gpu-check-out}}
mkdir -p "$OUT"
W=$(mktemp -d "${SHM:-/dev/shm}/rdaq-gpu-XXXX")
export TMPDIR="$W/tmp"
mkdir -p "$TMPDIR"
step() { # name timeout command...: runs it, its output to OUT/name.txt, its status noted
    local name=$1 t=$2; shift 2
    local s=$SECONDS
    timeout "$t" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc, $((SECONDS - s)) s" | tee -a "$OUT/steps.txt"
}
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nproc; grep -m1 'model name' /proc/cpuinfo
    ldconfig -p | grep -E 'libnvrtc|libcuda' | head
    "$R" --version
} >"$OUT/host.txt" 2>&1
step check 120 "$R" check
if ! grep -q "^result: the GPU backend can run here" "$OUT/check.txt"; then
    # NVRTC outside the library path (a CUDA toolkit or the cu13 wheel): name it
    nv=$(find / -xdev -name 'libnvrtc.so.1[23]*' 2>/dev/null | grep -v builtins | head -1)
    if [ -n "$nv" ]; then
        export RDAQ_NVRTC=$nv
        echo "RDAQ_NVRTC=$nv" >>"$OUT/host.txt"
        step check2 120 "$R" check
    fi
fi
step bench_gpu 300 "$R" bench gpu --frames 200
cat >"$W/lossy.toml" <<'TOML'
[reliability]
retransmit = false
[faults]
loss = 0.001
TOML
for pair in 1 2; do
    for b in cpu gpu; do
        step "run_lossy_${b}_$pair" 120 "$R" run --config "$W/lossy.toml" --backend $b --frames 200 --modules 4 \
            --out "$W/lossy_${b}_$pair" --stream none --preview none --tolerate-loss --summary-json "$W/lossy_${b}_$pair.json"
    done
done
for pair in 1 2; do
    step "equal_lossy_cpu_gpu_$pair" 60 python3 "$here/gpu_files_equal.py" "$W/lossy_cpu_$pair/rdaq_run_master.h5" "$W/lossy_gpu_$pair/rdaq_run_master.h5" \
        "$W/lossy_cpu_$pair.json" "$W/lossy_gpu_$pair.json"
done
step equal_lossy_cpu_cpu 60 python3 "$here/gpu_files_equal.py" "$W/lossy_cpu_1/rdaq_run_master.h5" "$W/lossy_cpu_2/rdaq_run_master.h5" \
    "$W/lossy_cpu_1.json" "$W/lossy_cpu_2.json"
step equal_lossy_gpu_gpu 60 python3 "$here/gpu_files_equal.py" "$W/lossy_gpu_1/rdaq_run_master.h5" "$W/lossy_gpu_2/rdaq_run_master.h5" \
    "$W/lossy_gpu_1.json" "$W/lossy_gpu_2.json"
rm -rf "$W"/lossy_*
for b in gpu cpu; do
    step "run_1khz_$b" 120 "$R" run --backend $b --modules 2 --rate 1000 --frames 10000 --out "$W/khz_$b" --stream none --preview none
    rm -rf "$W/khz_$b"
done
step pipeline_gpu_4m_nodark 240 "$R" bench pipeline --modules 8 --backend gpu --no-dark --workers 8,14,20 --seconds 3
step pipeline_gpu_4m_chopper 120 "$R" bench pipeline --modules 8 --backend gpu --workers 14 --seconds 2
step pipeline_cpu_4m_nodark 120 "$R" bench pipeline --modules 8 --no-dark --workers 14 --seconds 2
step pipeline_cpu_graph 240 "$R" bench pipeline --workers 1,8,16 --seconds 1.5
step pipeline_cpu_nodark 240 "$R" bench pipeline --no-dark --workers 1,8,16 --seconds 1.5
step pipeline_cpu_raw 240 "$R" bench pipeline --raw --workers 1,8,16 --seconds 1.5
rm -rf "$W"
echo "== done; outputs in $OUT"
