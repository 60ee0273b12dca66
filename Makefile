# The quickstart is two commands: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint typecheck unit sshd-deps train-model gpu clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch is pinned in the extra (CPU build from local disk here); never a bare `torch`.
	$(BIN)/pip install -q -e '.[server,dev,plot]'
	touch $(STAMP)

setup: $(STAMP)

## demo: run configs/quickstart.yaml on this machine against the reference server (no GPU, no ssh).
## Exit 1 means "a variant failed and the box was restored": the quickstart shows exactly that.
demo: setup
	@$(BIN)/campaign run quickstart; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 1 ] || exit $$rc

## sshd-deps: the SSH tests start a real OpenSSH sshd on 127.0.0.1; install it where it is missing.
sshd-deps:
	@test -x /usr/sbin/sshd || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null; fi; }

lint: setup
	$(BIN)/ruff check campaign kernels tests scripts
	$(BIN)/ruff format --check campaign kernels tests scripts

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest -q

test: setup sshd-deps lint typecheck unit

## train-model: reproduce the reference server's weights (fast on a GPU; hours on two CPU cores).
train-model: setup
	$(BIN)/python -m campaign.refserver.train --out campaign/refserver/weights/arith.safetensors

## gpu: what scripts/gpu.sh runs on the H200 machine (see docs/gpu.md).
gpu:
	bash scripts/gpu.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
