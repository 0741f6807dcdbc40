#!/usr/bin/env bash
# GPU figures in one command, on a machine with one CUDA device and no network (~8 minutes on
# an H200): rollout tokens/s of a random Qwen2.5-0.5B-shaped model at batch 64 and 256 (plain
# generate, the env, the env on the compiled static-cache path), one GRPO step with LoRA and
# full fine-tuning, and the demo pipeline on CUDA (4x128 and 8x512 policies), in that order;
# parts that would start after --deadline-s (default 420) are skipped. See benchmarks/gpu.py.
#
#   bash benchmarks/gpu.sh                 # uses the python on PATH (torch with CUDA installed)
#   WHEELS=dir bash benchmarks/gpu.sh      # first installs the wheel files in dir (--no-deps, into a temp dir)
#   bash benchmarks/gpu.sh --smoke         # tiny shapes: check the script on any machine first
#
# The wheels: `bash benchmarks/gpu_wheels.sh .whl` on a machine with PyPI fetches r3rag's dependencies
# that the GPU machine's image lacks (for the lent H200: trl, datasets, bm25s, faiss-cpu, ...).
# r3rag itself runs from src/ (no install: nothing is resolved or built there).
# The last line printed is JSON: {"gpu_rollout_speedup_b256": ..., ...}; record it in benchmarks/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -n "${WHEELS:-}" ]; then
    SITE=$(mktemp -d -t r3rag-site-XXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # gpu.py's stage runs start `python -m r3rag.cli`
if ! "$PY" -c "import r3rag.cli.app, trl, peft, bm25s, datasets" 2>/dev/null; then
    "$PY" -c "import r3rag.cli.app, trl, peft, bm25s, datasets" 2>&1 | tail -1 >&2
    echo "error: a dependency of r3rag is not importable; fetch wheels with benchmarks/gpu_wheels.sh and set WHEELS=<dir> (no network here)" >&2
    exit 2
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$PY" benchmarks/gpu.py "$@"
