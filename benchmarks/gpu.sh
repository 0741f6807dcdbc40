#!/usr/bin/env bash
# GPU figures in one command, on a machine with one CUDA device and no network (~8 minutes on
# an H200): the demo pipeline on CUDA (4x128 and 8x512 policies), rollout tokens/s of a random
# Qwen2.5-0.5B-shaped model at batch 64 and 256 (plain generate, the env, the env on the
# compiled static-cache path) and one GRPO step with LoRA and full fine-tuning. See benchmarks/gpu.py.
#
#   bash benchmarks/gpu.sh                 # uses the python on PATH (torch with CUDA installed)
#   WHEELS=dir bash benchmarks/gpu.sh      # installs r3rag's missing dependencies from wheel files
#   bash benchmarks/gpu.sh --smoke         # tiny shapes: check the script on any machine first
#
# Preparing the wheels on a machine with network, for the GPU machine's Python (e.g. 3.11):
#   pip download -d wheels --only-binary=:all: --python-version 3.11 \
#       "trl>=1.16,<1.17" "transformers>=5.0,<6" peft accelerate datasets bm25s rank-bm25 faiss-cpu typer rich pyyaml matplotlib
# The last line printed is JSON: {"gpu_rollout_speedup_b256": ..., ...}; record it in benchmarks/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import r3rag, trl, peft, bm25s" 2>/dev/null; then
    if [ -z "${WHEELS:-}" ]; then
        echo "error: r3rag or one of its dependencies is not importable; set WHEELS=<dir of wheel files> (no network here)" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" -e .
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PY" benchmarks/gpu.py "$@"
