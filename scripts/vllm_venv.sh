#!/usr/bin/env bash
# Build the throwaway venv in which scripts/bench_vs_vllm.py runs vLLM's bench client (`vllm bench serve`).
#
#   bash scripts/vllm_venv.sh [VENV]        # default /tmp/vllm-venv; about 1.8 GB, under two minutes here
#
# vLLM 0.34.0 pins torch==2.14.0 and a stack of CUDA kernels packages; its bench client needs none of them. So
# torch is the 2.13.0 CPU build (on the project's machines `pip install torch==2.13.0` takes the CPU wheel that
# lies on disk; elsewhere take 2.13.0 from PyTorch's CPU wheel index), vLLM goes in with --no-deps, and every
# other package is pinned and installed with --no-deps: the list is what `vllm bench serve` imports, found by
# trial (import, read the ModuleNotFoundError, add that one package), plus those packages' own dependencies.
# Nothing here resolves a requirement, so nothing can pull or replace torch. Never point this at the project's
# own .venv.
set -euo pipefail

VENV="${1:-/tmp/vllm-venv}"
case "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/$(basename "$VENV")" in
*/work/main/.venv*) echo "refusing to touch the project's own venv: $VENV" >&2; exit 2 ;;
esac
python3 -m venv "$VENV"
pip=("$VENV/bin/pip" install --no-deps --disable-pip-version-check -q)

# torch and its own dependencies.
"${pip[@]}" torch==2.13.0 filelock==4.3.1 fsspec==2026.9.0 Jinja2==3.1.6 MarkupSafe==3.0.4 mpmath==1.3.0 \
    networkx==3.6.1 sympy==1.14.0 typing_extensions==4.16.0 setuptools==84.2.1

"${pip[@]}" vllm==0.34.0

# What vllm.benchmarks.serve and the `vllm` CLI import on the way to `bench serve`, with their dependencies.
# (xgrammar declares triton, which is not needed here: vLLM only warns that its Triton kernels are missing.)
"${pip[@]}" \
    aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0 \
    anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 cachetools==8.0.2 cbor2==6.3.0 \
    certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1 cloudpickle==3.1.3 einops==0.8.2 \
    fastapi==0.136.3 frozenlist==1.8.0 h11==0.16.0 hf-xet==1.8.0 httpcore2==2.16.2 httpx2==2.16.2 \
    huggingface_hub==2.4.0 idna==3.20 jiter==0.19.0 llguidance==1.9.1 markdown-it-py==4.3.0 mdurl==0.1.2 \
    msgspec==0.23.0 multidict==7.2.1 numpy==2.4.6 openai==3.57.0 orjson==3.13.0 oss-harmony==0.0.11 \
    packaging==26.4 partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus_client==0.26.0 \
    propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 \
    Pygments==2.21.0 PyYAML==6.0.4 pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2 rich==15.0.0 \
    safetensors==0.8.0 shellingham==1.5.4 sniffio==1.3.1 starlette==1.10.0 tokenizers==0.23.3 tqdm==4.70.1 \
    transformers==5.22.2 truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5 urllib3==2.8.0 \
    uvicorn==0.55.0 uvloop==0.23.0 watchfiles==1.3.0 xgrammar==0.2.9 yarl==1.25.1

# The checks that matter: torch is still the pinned build, and the bench client starts.
"$VENV/bin/python" -c 'import torch, importlib.metadata as m; assert torch.__version__.startswith("2.13.0"), torch.__version__; print("torch", torch.__version__, "vllm", m.version("vllm"))'
"$VENV/bin/vllm" bench serve --help >/dev/null 2>&1 || { echo "vllm bench serve does not start" >&2; exit 1; }
echo "ready: $VENV/bin/vllm bench serve"
