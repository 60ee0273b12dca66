#!/usr/bin/env bash
# One call on the H200 machine: install the carried wheels, then run the GPU checks and benchmarks.
# Usage (on the device, from the repository root): bash scripts/gpu.sh [kernels] [tune] [refserver] [train] [loop] [profile]
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
    # Two seeds/learning rates side by side (the model is launch-bound, so they share the GPU well); the hard cap
    # keeps the call short whatever happens. Keep whichever reaches the higher exact accuracy.
    train)     timeout 300 python3 -m campaign.refserver.train --device cuda --time-limit 210 --seed 1 --lr 3e-3 \
                 --out "$OUT/arith-b.safetensors" >"$OUT/train-b.log" 2>&1 &
               timeout 300 python3 -m campaign.refserver.train --device cuda --time-limit 210 --seed 0 \
                 --out "$OUT/arith.safetensors" 2>&1 | tee "$OUT/train.log" || rc=1
               wait || rc=1; tail -3 "$OUT/train-b.log" ;;
    # kernels: GPU tests at full shapes (no conftest: its fixtures need packages the device lacks), then the
    # benchmark with a small MMA sweep. KERNELS_BENCH_ARGS adds options (e.g. --skip indexer).
    kernels)   timeout 180 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider \
                 tests/test_kernels.py tests/test_kernels_indexer.py 2>&1 | tee "$OUT/kernels-tests.log" || rc=1
               timeout 330 python3 -m kernels.bench --sweep ${KERNELS_BENCH_ARGS:-} --json "$OUT/kernels-bench.json" \
                 2>&1 | tee "$OUT/kernels-bench.txt" || rc=1 ;;
    # tune: the MMA decode sweep (kernels/tune.py; TUNE_ARGS adds options), then the decode GPU tests.
    tune)      timeout 480 python3 -m kernels.tune --json "$OUT/tune.json" --budget-s "${TUNE_BUDGET_S:-360}" \
                 ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune.txt" || rc=1
               timeout 150 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/test_kernels.py \
                 2>&1 | tee "$OUT/tune-tests.log" || rc=1 ;;
    # REFSERVER_BUDGET_S: start no new combination after this many seconds (the device time is shared).
    refserver) timeout 540 python3 -m campaign.refserver.gpucheck --json "$OUT/refserver-gpu.json" \
                 --budget-s "${REFSERVER_BUDGET_S:-400}" >"$OUT/refserver-gpu.log" 2>&1 || rc=1
               grep -v '^\[' "$OUT/refserver-gpu.log" | tail -40 ;;
    # loop: the campaign itself on this GPU (local host, configs/h200-local.yaml): every variant smoke-tested and
    # benchmarked, one real failure diagnosed, isolated and restored. The run store stays under /tmp (it nests
    # deeper than $OUT can return); the JSON report and `campaign show` come back. Exit 1 = a variant failed as planned.
    loop)      timeout 400 python3 -m campaign.cli --runs-dir /tmp/campaign-runs run configs/h200-local.yaml --json \
                 >"$OUT/loop.json" 2>"$OUT/loop.err"; code=$?
               echo "campaign run exit $code"; [ "$code" -le 1 ] || rc=1
               python3 -m campaign.cli --runs-dir /tmp/campaign-runs show last >"$OUT/loop-show.txt" 2>&1
               tail -5 "$OUT/loop.err"; head -60 "$OUT/loop-show.txt" ;;
    # profile: Nsight Compute on one steady call of the H=16, B=32 MMA split kernel (when ncu is installed).
    profile)   ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
               if [ -z "$ncu_bin" ]; then echo "no ncu on this machine" | tee "$OUT/ncu.txt"
               else timeout 150 "$ncu_bin" --kernel-name regex:_mma_decode_kernel --launch-skip 3 --launch-count 1 \
                      --set full python3 scripts/ncu_mma.py >"$OUT/ncu.txt" 2>&1 || rc=1; tail -150 "$OUT/ncu.txt"; fi ;;
    *) echo "unknown section: $s (kernels, tune, refserver, train, loop, profile)"; rc=2 ;;
  esac
done
exit $rc
