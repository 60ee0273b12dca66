#!/usr/bin/env bash
# One call on the H200 machine: install the carried wheels, then run the GPU checks and benchmarks.
# Usage (on the device, from the repository root): bash scripts/gpu.sh [kernels] [kernels-quick] [kernels-bench] [longctx-model] [diagnose] [tune] [refserver] [train] [loop] [sla] [indexer] [ssh] [probe] [profile] [warpgroup] [gather] [mmasync] [split] [wake]
# Results go under $OUT (or ./gpu-out when OUT is unset). Carry `.whl` (built by scripts/build_wheels.sh) with the call,
# and `.deb` (scripts/build_debs.sh) for the `ssh` section.
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
               timeout 330 python3 -m mla_kernels.bench --sweep ${KERNELS_BENCH_ARGS:-} --json "$OUT/kernels-bench.json" \
                 2>&1 | tee "$OUT/kernels-bench.txt" || rc=1 ;;
    # kernels-quick (~2.5 minutes): GPU tests of the tiled SIMT kernel and the MMA V-split candidate at DeepSeek's
    # shapes (H = 16 and 128, K = 2048); the benchmark at only the shapes the goals are judged at (H=16 B=32/128,
    # H=128 B=32); the V-split candidate timed by the tune sweep (H=128, B=32 and 128); the benchmark's table last.
    # kernels-bench: the --quick benchmark alone (its own correctness checks on every shape), no pytest, no sweep.
    kernels-bench) timeout 150 python3 -m mla_kernels.bench --quick --json "$OUT/kernels-quick.json" \
                     >"$OUT/kernels-quick.txt" 2>&1 || rc=1
                   grep -E 'ceilings|FAIL|failed' "$OUT/kernels-quick.txt"; tail -17 "$OUT/kernels-quick.txt" ;;
    # longctx-model: the long-context model widened to DeepSeek's MLA widths, made where it is used (85 MB).
    longctx-model) timeout 120 python3 -m campaign.refserver.widening \
                     --model-path campaign/refserver/weights/longctx.safetensors \
                     --out campaign/refserver/weights/longctx-wide.safetensors 2>&1 | tail -3 || rc=1 ;;
    # diagnose: the 200 MB log benchmark (issue 13: under 5 s and 200 MB each) on a quiet machine.
    diagnose)      timeout 240 python3 scripts/bench_diagnose.py --out "$OUT/bench-diagnose.json" 2>&1 \
                     | tee "$OUT/bench-diagnose.txt" | tail -8 || rc=1 ;;
    kernels-quick)
               timeout 75 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/test_kernels.py \
                 -k "(gpu_backend_matches and simt-tiled and not server) or simt_tiled_configs or (cuda_graph and simt-tiled) or v_split" \
                 2>&1 | tee "$OUT/kernels-quick-tests.log" | tail -5 || rc=1
               timeout 150 python3 -m mla_kernels.bench --quick --json "$OUT/kernels-quick.json" \
                 >"$OUT/kernels-quick.txt" 2>&1 || rc=1
               timeout 60 python3 -m mla_kernels.tune --round 2 --only h128-vsplit-h64-n16-w4-s3 --budget-s 40 \
                 --json "$OUT/kernels-quick-vsplit.json" 2>&1 | tee "$OUT/kernels-quick-vsplit.txt" | grep -E "vsplit|ERROR" || rc=1
               grep -E 'ceilings|FAIL|failed' "$OUT/kernels-quick.txt"; tail -17 "$OUT/kernels-quick.txt" ;;
    # warpgroup: the Gluon wgmma kernel's GPU tests (issue 15, H >= 64), then its tuning sweep against the V split.
    warpgroup) timeout 150 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/test_kernels_warpgroup.py \
                 2>&1 | tee "$OUT/warpgroup-tests.log" | tail -15 || rc=1
               timeout 300 python3 -m mla_kernels.tune --round 4 --budget-s "${TUNE_BUDGET_S:-240}" \
                 --json "$OUT/tune4.json" 2>&1 | tee "$OUT/tune4.txt" | tail -16 || rc=1 ;;
    # mmasync: the Gluon mma.sync kernel's GPU tests (issue 15, H = 16), then its tuning sweep against the tl.dot one.
    mmasync)   timeout 150 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/test_kernels_mmasync.py \
                 2>&1 | tee "$OUT/mmasync-tests.log" | tail -15 || rc=1
               timeout 300 python3 -m mla_kernels.tune --round 5 --budget-s "${TUNE_BUDGET_S:-200}" \
                 --json "$OUT/tune5.json" 2>&1 | tee "$OUT/tune5.txt" | tail -20 || rc=1 ;;
    # gather: the read-only gather at decode's pattern (the H = 16 read ceiling, issue 15).
    gather)    timeout 200 python3 scripts/bench_gather.py --json "$OUT/gather.json" 2>&1 | tee "$OUT/gather.txt" || rc=1 ;;
    # split: where the Gluon kernels' split-K time goes (kernel alone, merge, bf16 partials, one split).
    split)     timeout 200 python3 scripts/bench_split.py --json "$OUT/split.json" 2>&1 | tee "$OUT/split.txt" || rc=1 ;;
    # tune: the MMA decode sweep (mla_kernels/tune.py; TUNE_ARGS adds options), then the decode GPU tests.
    tune)      timeout 480 python3 -m mla_kernels.tune --json "$OUT/tune.json" --budget-s "${TUNE_BUDGET_S:-360}" \
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
    # sla: the SLA search inside the loop (configs/h200-sla.yaml): simt and mma, two launches each, the highest
    # concurrency within TTFT p90 and TPOT p90; then the comparison of the two over their launches.
    sla)       timeout 420 python3 -m campaign.cli --runs-dir /tmp/campaign-runs run configs/h200-sla.yaml --json \
                 >"$OUT/sla.json" 2>"$OUT/sla.err"; code=$?
               echo "campaign run exit $code"; [ "$code" -le 1 ] || rc=1
               python3 -m campaign.cli --runs-dir /tmp/campaign-runs show last >"$OUT/sla-show.txt" 2>&1
               python3 -m campaign.cli --runs-dir /tmp/campaign-runs compare last >"$OUT/sla-compare.txt" 2>&1
               tail -5 "$OUT/sla.err"; head -80 "$OUT/sla-show.txt"; head -60 "$OUT/sla-compare.txt" ;;
    # indexer: the O(context) against the O(max_context) indexer at 128k max context (configs/h200-indexer.yaml,
    # the local host), then the comparison over the launches.
    indexer)   cfg=${INDEXER_CONFIG:-configs/h200-indexer.yaml}; tag=$(basename "$cfg" .yaml)
               timeout "${INDEXER_TIMEOUT_S:-300}" python3 -m campaign.cli --runs-dir /tmp/campaign-runs run \
                 "$cfg" --json >"$OUT/$tag.json" 2>"$OUT/$tag.err"; code=$?
               echo "campaign run exit $code"; [ "$code" -le 1 ] || rc=1
               python3 -m campaign.cli --runs-dir /tmp/campaign-runs show last >"$OUT/$tag-show.txt" 2>&1
               python3 -m campaign.cli --runs-dir /tmp/campaign-runs compare last >"$OUT/$tag-compare.txt" 2>&1
               tail -5 "$OUT/$tag.err"; head -30 "$OUT/$tag-show.txt"; sed -n '/^Metrics/,$p' "$OUT/$tag-compare.txt" ;;
    # ssh: the campaign over SSH, not as a local host (configs/h200-ssh.yaml): scripts/device_sshd.sh unpacks the
    # carried .deb/ under /tmp/campaign-sshd and starts an sshd on 127.0.0.1 (throwaway keys, the host key checked
    # from its known_hosts); vars.python is this shell's python3 by its full path, since the login shell's rc files
    # may put another first on the PATH. The run folder comes back as a tarball (it nests deeper than $OUT returns).
    # SSH_SET: more --set overrides, one a line (the CPU rehearsal in docs/gpu.md uses it). Exit 1 = starved-kv failed.
    ssh)       if bash scripts/device_sshd.sh start >"$OUT/ssh-sshd.log" 2>&1; then
                 cat "$OUT/ssh-sshd.log"
                 sets=(--set "vars.python=$(command -v python3)")
                 while IFS= read -r line; do [ -z "$line" ] || sets+=(--set "$line"); done <<<"${SSH_SET:-}"
                 timeout "${SSH_TIMEOUT_S:-420}" python3 -m campaign.cli --runs-dir /tmp/campaign-runs-ssh run \
                   "${SSH_CONFIG:-configs/h200-ssh.yaml}" \
                   "${sets[@]}" --json >"$OUT/ssh.json" 2>"$OUT/ssh.err"; code=$?
                 echo "campaign run exit $code"; [ "$code" -le 1 ] || rc=1
                 python3 -m campaign.cli --runs-dir /tmp/campaign-runs-ssh show last >"$OUT/ssh-show.txt" 2>&1
                 # The comparison over the run's launches (a run of one launch each says "not significant").
                 python3 -m campaign.cli --runs-dir /tmp/campaign-runs-ssh compare last >"$OUT/ssh-compare.txt" 2>&1
                 python3 -m campaign.cli --runs-dir /tmp/campaign-runs-ssh compare last --json \
                   >"$OUT/ssh-compare.json" 2>/dev/null
                 run_id=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["run_id"])' "$OUT/ssh.json" \
                   2>/dev/null) && tar czf "$OUT/ssh-run.tgz" -C /tmp/campaign-runs-ssh "$run_id"
                 bash scripts/device_sshd.sh stop || rc=1
                 { echo "--- sshd's own log"; cat /tmp/campaign-sshd/sshd.log; } >>"$OUT/ssh-sshd.log"
                 tail -5 "$OUT/ssh.err"; head -40 "$OUT/ssh-show.txt"; head -40 "$OUT/ssh-compare.txt"
                 echo "--- summary (ssh): campaign exit $code; sshd accepted $(grep -c 'Accepted publickey' \
                   /tmp/campaign-sshd/sshd.log) key logins; host key checked against /tmp/campaign-sshd/known_hosts"
                 python3 - "$OUT/ssh.json" <<'PY' || echo "no report (see ssh.err)"
import json, sys
d = json.load(open(sys.argv[1]))
print(f"run {d['run_id']} on {d['host']}: {d['status']}")
for a in d["attempts"]:
    levels = (a.get("bench") or {}).get("levels") or []
    tput = " ".join(f"{lv['label']}={lv['output_throughput']:.0f}tok/s" for lv in levels)
    ready = (a.get("timings") or {}).get("launch_to_ready_s")
    why = f" {a['failed_phase']}/{(a.get('diagnosis') or {}).get('kind')}" if a["outcome"] != "passed" else ""
    print(f"  #{a['index']} {a['variant']} ({a['role']}): {a['outcome']}{why} ready={ready} {tput}")
for r in d.get("attribution") or []:
    print("  attribution:", r["statement"])
print("  final:", d["final"]["detail"])
PY
               else
                 cat "$OUT/ssh-sshd.log"; echo "--- summary (ssh): the sshd did not start (above); no campaign ran"; rc=1
               fi ;;
    # probe: one decode step of the long-context server split into GPU time, the engine's host work and (by
    # difference with the served ITL) HTTP: mma with each indexer form at 128k max context, then simt and mma at 16k
    # (scripts/decode_step_probe.py; the wide model first, from longctx-model).
    probe)     timeout 150 python3 scripts/decode_step_probe.py --steps 30 --context-length 131072 --form mma:aware \
                 --form mma:naive --json "$OUT/probe-128k.json" 2>&1 | grep -v '^\[' | tee "$OUT/probe.txt" || rc=1
               timeout 120 python3 scripts/decode_step_probe.py --steps 30 --context-length 16384 --form simt:aware \
                 --form mma:aware --json "$OUT/probe-16k.json" 2>&1 | grep -v '^\[' | tee -a "$OUT/probe.txt" || rc=1 ;;
    # profile: Nsight Compute on one steady call of the mma backend's kernel at H=16, B=32 (when ncu is installed):
    # the Gluon mma.sync kernel on Hopper. PROFILE_HEADS=128 profiles the warpgroup kernel; PROFILE_BATCH sets B.
    profile)   ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
               if [ -z "$ncu_bin" ]; then echo "no ncu on this machine" | tee "$OUT/ncu.txt"
               else heads=${PROFILE_HEADS:-16}; kname=_mmasync_decode_kernel; [ "$heads" -ge 64 ] && kname=_warpgroup_decode_kernel
                    timeout 150 "$ncu_bin" --kernel-name "regex:$kname" --launch-skip 3 --launch-count 1 \
                      --set full python3 scripts/ncu_mma.py --heads "$heads" \
                      --batch "${PROFILE_BATCH:-32}" >"$OUT/ncu.txt" 2>&1 || rc=1
                    tail -150 "$OUT/ncu.txt"; fi ;;
    # wake (issue 30): the compiled mma server (bf16, CUDA graphs) cold-started, parked by its sleep route while a
    # faulty variant runs on another port, then woken and proven by log-probabilities (scripts/bench_wake.py): cold
    # start against restore, and the GPU memory in use ready / parked / while the variant runs / woken. Then the same
    # server with its sleep routes off, parked by `cuda-checkpoint --toggle` (the generic path), where the tool is.
    wake)      timeout 420 python3 scripts/bench_wake.py --rounds "${WAKE_ROUNDS:-3}" --workdir /tmp/bench-wake \
                 --json "$OUT/wake.json" -- --device cuda --attention-backend mma --dtype bfloat16 \
                 --enable-torch-compile 2>&1 | grep -v '^\[' | tee "$OUT/wake.txt" || rc=1
               if command -v cuda-checkpoint >/dev/null 2>&1; then
                 timeout 150 python3 scripts/bench_wake.py --rounds 1 --via cuda_checkpoint --workdir /tmp/bench-wake-ckpt \
                   --json "$OUT/wake-ckpt.json" -- --device cuda --attention-backend mma --dtype bfloat16 2>&1 \
                   | grep -v '^\[' | tee "$OUT/wake-ckpt.txt" || rc=1
               else echo "no cuda-checkpoint on this machine: the checkpoint path is unmeasured" | tee "$OUT/wake-ckpt.txt"; fi
               for f in /tmp/bench-wake/*.log; do cp "$f" "$OUT/wake-$(basename "$f")"; done
               for f in /tmp/bench-wake-ckpt/*.log; do [ -e "$f" ] && cp "$f" "$OUT/wake-ckpt-$(basename "$f")"; done ;;
    *) echo "unknown section: $s (kernels, kernels-quick, kernels-bench, longctx-model, diagnose, tune, refserver, train, loop, sla, indexer, ssh, probe, profile, warpgroup, gather, mmasync, split, wake)"; rc=2 ;;
  esac
done
exit $rc
