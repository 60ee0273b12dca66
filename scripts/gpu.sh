#!/usr/bin/env bash
# One call on the H200 machine: install the carried wheels, then run the GPU checks and benchmarks.
# Usage (on the device, from the repository root): bash scripts/gpu.sh [kernels] [refserver] [train]
# Results go under $OUT (or ./gpu-out when OUT is unset). Carry `.whl` with the call.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(kernels refserver)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/gpu.txt"
rc=0
for s in "${sections[@]}"; do
  case "$s" in
    train)     python3 -m campaign.refserver.train --device cuda --out "$OUT/arith.safetensors" 2>&1 | tee "$OUT/train.log" || rc=1 ;;
    kernels)   python3 -m pytest -q -m gpu tests/test_kernels.py 2>&1 | tee "$OUT/kernels-tests.log" || rc=1
               python3 -m kernels.bench --json "$OUT/kernels-bench.json" 2>&1 | tee "$OUT/kernels-bench.txt" || rc=1 ;;
    refserver) python3 -m campaign.refserver.gpucheck --json "$OUT/refserver-gpu.json" 2>&1 | tee "$OUT/refserver-gpu.txt" || rc=1 ;;
    *) echo "unknown section: $s (kernels, refserver, train)"; rc=2 ;;
  esac
done
exit $rc
