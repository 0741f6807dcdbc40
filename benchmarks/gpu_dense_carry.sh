#!/usr/bin/env bash
# Pack, on a machine with PyPI and ../shared, what benchmarks/gpu.py's dense part (issue 18) needs on a
# GPU machine without network whose image has torch and transformers but no faiss: the faiss-cpu and
# orjson wheels (Python 3.12), all-MiniLM-L6-v2 saved in fp16 (on CUDA r3rag's Encoder casts it to fp16
# anyway, so the vectors are the same; fp16 halves the 91 MB to 45 MB, xz to 41) and the shared pools' corpus and
# question files. Everything fits the 64 MiB a device call may carry, barely (63 MB with the repo's 2 MB).
#
#   bash benchmarks/gpu_dense_carry.sh [DEST]     # default DEST: .gpu-carry (add it to .git/info/exclude)
#
# Then, on the device (carry DEST and nothing else; ~3-5 min on an H200, start-up aside):
#   mkdir -p /tmp/m /tmp/d /tmp/site && tar xJf .gpu-carry/minilm-fp16.tar.xz -C /tmp/m \
#     && tar xJf .gpu-carry/data.tar.xz -C /tmp/d \
#     && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-carry/*.whl \
#     && PYTHONPATH=/tmp/site:src R3RAG_DATA=/tmp/d PYTHONUNBUFFERED=1 \
#        python3 benchmarks/gpu.py --parts dense --dense-encoder /tmp/m 2>&1 | tee $OUT/dense.log
# The last line is JSON: dense_recall10_vs_flat, dense_bytes_per_passage, dense_encode_passages_per_s
# (MiniLM), e5_base_shaped_passages_per_s...; record it in benchmarks/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu-carry}
PY=${PYTHON:-.venv/bin/python}
DATA=${R3RAG_DATA:-../shared/data}
[ -d "$DATA/corpus" ] || { echo "error: no shared pools at $DATA/corpus (set R3RAG_DATA)" >&2; exit 2; }
rm -rf "$DEST" && mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "faiss-cpu>=1.8" "orjson>=3.9"
MODEL=$(mktemp -d -t r3rag-minilm-XXXX)
"$PY" - "$MODEL" <<'EOF'
import sys

import torch
from transformers import AutoModel, AutoTokenizer

from r3rag.retrieval.dense import resolve_encoder

path = resolve_encoder("")  # all-MiniLM-L6-v2 from its PyPI package
AutoModel.from_pretrained(path, dtype=torch.float16).save_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(path).save_pretrained(sys.argv[1])
EOF
tar cJf "$DEST/minilm-fp16.tar.xz" -C "$MODEL" .
rm -rf "$MODEL"
# the pools (corpus/) and the question files the dense part draws its queries from (*/*.jsonl)
(cd "$DATA" && tar cJf - corpus $(find . -mindepth 2 -maxdepth 2 -name '*.jsonl' -not -path './corpus/*')) \
    > "$DEST/data.tar.xz"
du -sh "$DEST"
ls -la "$DEST"
