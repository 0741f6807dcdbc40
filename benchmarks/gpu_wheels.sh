#!/usr/bin/env bash
# Fetch, on a machine with PyPI, the wheels benchmarks/gpu.sh needs on a GPU machine without
# network: r3rag's dependencies that its image lacks. Made for the lent H200 (Python 3.12, with
# torch, transformers, accelerate, peft, typer, rich, scipy, pandas, pyarrow, matplotlib and
# huggingface-hub already installed); other images may lack more.
#
#   bash benchmarks/gpu_wheels.sh [DEST]         # default DEST: .whl (ignored by git), ~25 MB
#   WHEELS=.whl bash benchmarks/gpu.sh           # there: installs them with --no-deps into a temp dir
#
# datasets stays below 5: 5.x needs pyarrow >= 24, 4.8 any pyarrow >= 21. pydantic comes with its
# own dependencies (pydantic-core's version must match): recent typer imports it.
set -euo pipefail
DEST=${1:-.whl}
PY=${PYTHON:-python3}
PYVER=${GPU_PYTHON_VERSION:-3.12}
TARGET=(--only-binary=:all: --python-version "$PYVER" --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$DEST" \
    "trl>=1.16,<1.17" "datasets>=4.7,<5" "dill>=0.3,<0.4.2" "multiprocess<0.70.20" \
    "bm25s>=0.2.10,<0.4" "rank-bm25>=0.2.2" "faiss-cpu>=1.8" "orjson>=3.9"
"$PY" -m pip download -q "${TARGET[@]}" -d "$DEST" "pydantic>=2,<3"
rm -f "$DEST"/typing_extensions-*.whl  # the image has it; keep its version
du -sh "$DEST"
ls "$DEST"
