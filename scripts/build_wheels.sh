#!/usr/bin/env bash
# Build .whl/, the wheels the GPU machine lacks, from pyproject.toml (see docs/gpu-workflow.md).
#
# The device has python3 3.12 with torch, triton, numpy, safetensors and transformers but no network, so every
# other runtime dependency of the orchestrator and of the reference server travels as a wheel named in `carry`.
# Usage: bash scripts/build_wheels.sh [EXTRA ...]   (default extras: server; the base dependencies always)
# Result: .whl/*.whl for CPython 3.12 on manylinux x86_64, one version per distribution.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=("$@")
[ ${#extras[@]} -eq 0 ] && extras=(server)
PY=${PYTHON:-python3}

# What the device already ships and must not be shadowed by a carried copy (a second torch or triton would break
# the CUDA build there; numpy/safetensors/transformers come with it).
skip='^(torch|triton|numpy|safetensors|transformers|tokenizers|nvidia-.*|cuda-.*)$'

reqs=$("$PY" - "$skip" "${extras[@]}" <<'PY'
import re, sys, tomllib
skip = re.compile(sys.argv[1])
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = list(project["dependencies"])
for extra in sys.argv[2:]:
    wanted += project.get("optional-dependencies", {}).get(extra, [])
for req in wanted:
    name = re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]
    # Environment markers for other platforms (e.g. triton only on Linux) are left to pip; skipped names go.
    if not skip.match(name.lower()):
        print(req)
PY
)
echo "requirements from pyproject (${extras[*]}):"; echo "$reqs" | sed 's/^/  /'

rm -rf .whl && mkdir -p .whl
exclude="$(git rev-parse --git-common-dir)/info/exclude"   # a worktree shares the main checkout's
mkdir -p "$(dirname "$exclude")"; grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
# --isolated: no local pip configuration (this dev machine's index and torch cap must not decide what ships).
# shellcheck disable=SC2086
echo "$reqs" | "$PY" -m pip download --isolated -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl -r /dev/stdin
# pip resolves transitive needs too; drop what the device has (by distribution name, normalised).
for w in .whl/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-')
  if [[ $name =~ $skip ]]; then rm -f "$w"; fi
done
ls .whl | sed 's/^/  /'
du -sh .whl | awk '{print "total", $1, "(the device call carries at most 64 MiB with the working tree)"}'
