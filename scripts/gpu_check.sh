#!/usr/bin/env bash
# The checks and figures only a CUDA machine gives: the compiled Triton kernels against their references
# (tests/ops/test_triton_kernels.py without the interpreter), `attnzoo selftest --device cuda`, and the op
# benchmarks (ToST Fig. 6/7 shapes) and the varlen sweep (padded/packed against unmasked at equal real tokens) on
# the GPU. Usage: bash scripts/gpu_check.sh [OUT_DIR]
# Runs from a checkout without installing (PYTHONPATH=src); each step has its own time limit (all five: ~15 min on
# an H200, the full selftest ~3 min of it).
# GPU_CHECK_STEPS picks steps (default: all of triton-tests selftest bench-n bench-d bench-varlen bench-varlen-triton).
set -uo pipefail
out=${1:-results/gpu-check}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 MPLBACKEND=Agg
py=${PYTHON:-python3}
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$out/gpu.txt"
status=0
steps=" ${GPU_CHECK_STEPS:-triton-tests selftest bench-n bench-d bench-varlen bench-varlen-triton} "
step() {  # step NAME SECONDS CMD...: run CMD with a time limit, log to OUT/NAME.log, remember a failure
    local name=$1 limit=$2
    shift 2
    [[ $steps == *" $name "* ]] || return 0
    echo "== $name: $*"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}
step triton-tests 180 $py -m pytest -q -p no:cacheprovider -n 4 tests/ops/test_triton_kernels.py tests/ops/test_triton_varlen.py
step selftest 300 $py -m attnzoo selftest --device cuda
step bench-n 200 $py -m attnzoo bench --device cuda --sweeps n --causal both --lengths 1024 4096 16384 65536 \
    --mechanisms softmax,softmax_explicit,linear,xca,mssa,tssa,tssa_torch,fastmax_p1,fastmax_p1_autograd,fastmax_p2,fastmax_p2_autograd,csp,cbsa \
    --repeats 3 --budget-s 1 --out "$out/bench-n" --overwrite
step bench-d 90 $py -m attnzoo bench --device cuda --preset paper --sweeps d --heads 32 \
    --mechanisms softmax,linear,tssa,tssa_torch,fastmax_p1,csp,cbsa --repeats 5 --budget-s 2 --out "$out/bench-d" --overwrite
step bench-varlen 150 $py -m attnzoo bench --device cuda --sweeps varlen --mechanisms tssa,fastmax_p1,fastmax_p2,linear \
    --varlen-batch 4 --varlen-length 4096 --dim 384 --heads 8 --repeats 5 --out "$out/bench-varlen" --overwrite
# the same with the masked Triton kernels ("auto" keeps the PyTorch masked paths until these figures say otherwise)
step bench-varlen-triton 150 $py -m attnzoo bench --device cuda --sweeps varlen --mechanisms tssa,fastmax_p1,fastmax_p2 \
    --varlen-backend triton --varlen-batch 4 --varlen-length 4096 --dim 384 --heads 8 --repeats 5 \
    --out "$out/bench-varlen-triton" --overwrite
exit $status
