#!/usr/bin/env bash
# Qwen3-TTS speed and capacity on a lent NVIDIA GPU (one short run; prints RTF and TTFA,
# then the concurrent-stream capacity table of benchmarks/qwen3_capacity.py).
#
# Run from the repository root on the device machine:
#     bash benchmarks/qwen3_gpu.sh            # 0.6B and 1.7B, 48 frames each
#     FRAMES=96 CONFIGS="0.6b" bash benchmarks/qwen3_gpu.sh
#     STREAMS=1,8,32 CAP_FRAMES=36 bash benchmarks/qwen3_gpu.sh   # capacity: N streams
#     SKIP_SPEED=1 bash benchmarks/qwen3_gpu.sh                  # capacity only
# Needs python3 with a CUDA build of torch (and numpy). gguf, tokenizers, structlog
# and pyyaml come, in this order, from $PYDEPS (default ./.whl/pydeps: plain package
# folders put on PYTHONPATH; all pure Python except tokenizers, whose .so is abi3),
# the system, or an offline pip install (--no-deps) from wheels in $WHEELS (./.whl).
# Prepare .whl/pydeps here and carry ".whl" (about 17 MiB):
#   mkdir -p .whl/pydeps && cp -r .venv/lib/python3.11/site-packages/{gguf,structlog,tqdm,yaml,tokenizers} .whl/pydeps/
# onnx + onnxruntime are optional: without them the tiny vocoder is skipped and TTFA = time until the first chunk's frames.
# Random f16 weights are generated on the fly into $WORK (default /tmp/qwen3bench);
# nothing is downloaded. Targets (H200, 0.6B, one stream): >= 5x real time, TTFA <= 50 ms;
# capacity: >= 32 concurrent streams in real time, p95 TTFA <= 100 ms, zero underruns.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
FRAMES=${FRAMES:-48}
CONFIGS=${CONFIGS:-"0.6b 1.7b"}
WORK=${WORK:-/tmp/qwen3bench}
DTYPE=${DTYPE:-bfloat16}
DEVICE=${DEVICE:-cuda}
PYDEPS=${PYDEPS:-.whl/pydeps}
STREAMS=${STREAMS:-1,2,4,8,16,32,64}
CAP_FRAMES=${CAP_FRAMES:-48}
SENTENCES=${SENTENCES:-2}
SKIP_SPEED=${SKIP_SPEED:-0}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$PYDEPS" ]; then
    export PYTHONPATH="$(cd "$PYDEPS" && pwd):$PYTHONPATH"
fi

need=$("$PY" - <<'EOF'
import importlib.util as u
mods = {"numpy": "numpy", "gguf": "gguf", "tokenizers": "tokenizers",
        "structlog": "structlog", "yaml": "pyyaml", "tqdm": "tqdm"}
print(" ".join(pkg for mod, pkg in mods.items() if u.find_spec(mod) is None))
EOF
)
if [ -n "$need" ]; then
    echo "installing (offline, from $WHEELS): $need"
    "$PY" -m venv --system-site-packages /tmp/qwen3venv
    PY=/tmp/qwen3venv/bin/python
    "$PY" -m pip install -q --no-deps --no-index --find-links "$WHEELS" $need
fi
"$PY" - <<'EOF'
import importlib.util, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnx"):
    import onnxruntime
    print("onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
else:
    print("onnx/onnxruntime missing: vocoder skipped")
EOF
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true

if [ "$SKIP_SPEED" != "1" ]; then
    for cfg in $CONFIGS; do
        echo "=== $cfg, $DEVICE, $DTYPE, $FRAMES frames"
        "$PY" benchmarks/qwen3_speed.py --config "$cfg" --device "$DEVICE" --dtype "$DTYPE" \
            --frames "$FRAMES" --work-dir "$WORK" --repeat 3
    done
fi
for cfg in $CONFIGS; do
    echo "=== capacity $cfg, $DEVICE, $DTYPE, streams $STREAMS, $SENTENCES x $CAP_FRAMES frames"
    "$PY" benchmarks/qwen3_capacity.py --config "$cfg" --device "$DEVICE" --dtype "$DTYPE" \
        --streams "$STREAMS" --frames "$CAP_FRAMES" --sentences "$SENTENCES" \
        --work-dir "$WORK" --json "$WORK/capacity-$cfg.json"
done
