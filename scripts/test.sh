#!/usr/bin/env bash
# The README's second command: install everything into .venv and run the whole test
# suite (lint, types, unit, property-based and integration tests with real models and
# real processes). Safe to re-run; CI calls it from .ci/run on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TTSDOCK_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
python -m pip install -q --upgrade pip || echo "pip upgrade skipped (offline?)" >&2
# torch first and pinned, so that the resolver keeps it instead of choosing another build
# for the qwen3 extra. Where a local CPU wheel is configured for pip it is used; elsewhere
# set PIP_EXTRA_INDEX_URL to PyTorch's CPU wheel index to avoid a multi-GB CUDA build.
python -m pip install -q "torch==${TTSDOCK_TORCH_VERSION:-2.13.0}"
python -m pip install -q -e '.[kokoro,qwen3,dev,http]'
echo "== ruff"; ruff check . && ruff format --check .
echo "== mypy"; mypy
echo "== pytest"
set +e
python -m pytest "$@"
rc=$?
set -e
# pytest exit 5 = no tests collected: a run that tests nothing is a failure here.
[ "$rc" -eq 5 ] && { echo "no tests were collected" >&2; exit 1; }
exit "$rc"
