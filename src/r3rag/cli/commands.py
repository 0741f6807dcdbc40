"""The commands that are not one stage each: `report`, `eval-retrieval`, `import-model`, `import`,
`serve-retriever` and `runs`, as plain functions that r3rag.cli registers on the app under those names
(`run` is in r3rag.cli.run).

Usage:
    r3rag report eval:latest --screenshot
    r3rag report --results results/replicate.json
    r3rag eval-retrieval questions.jsonl --index index:latest --ks 1,5,10
    r3rag import-model smollm2-135m-instruct
    r3rag import hotpot_dev.json --out questions.jsonl --corpus-out corpus.jsonl
    r3rag serve-retriever --index index:latest --port 8000
    r3rag runs sft

Each imports what it runs (and rich, to print) inside its body, so that `--help` stays fast (r3rag.cli).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from r3rag.cli.base import DebugOpt, RunsOpt, SetOpt, guard
from r3rag.util.errors import UserError


def report_cmd(
    evals: Annotated[
        list[str] | None, typer.Argument(help="Eval artifacts: eval:latest, eval:<id> or a directory.")
    ] = None,
    name: Annotated[str, typer.Option(help="Name of the report artifact.")] = "default",
    screenshot: Annotated[bool, typer.Option(help="Also write viewer.png (headless Chromium).")] = False,
    results: Annotated[
        list[Path] | None,
        typer.Option(
            help="Instead: regenerate the docs' blocks and charts made from this results file "
            "(`<!-- r3rag:results FILE TABLE -->` markers; repeatable), after merging into it the slice "
            "files in the folder of its name (results/replicate/*.json), where there are any."
        ),
    ] = None,
    docs: Annotated[
        list[Path] | None,
        typer.Option(help="With --results: the Markdown files (default: README.md, docs/*.md, benchmarks/RESULTS.md)."),
    ] = None,
    runs_dir: RunsOpt = None,
    debug: DebugOpt = False,
):
    """One table over eval artifacts (terminal, Markdown, CSV), a bar chart PNG and an HTML trajectory viewer;
    or, with --results, the tables and charts in the docs generated from an experiment's results file."""

    def go():
        from r3rag.experiments.pipeline import run_stage

        if results or docs:
            from r3rag.experiments.results.docs import doc_files, update_docs

            if evals or not results:
                raise UserError("report: --results regenerates the docs and takes no eval artifacts; --docs needs it")
            merged = _merge_slices(results)
            written, found = update_docs(docs or doc_files(Path.cwd()), Path.cwd(), results)
            if not found and not merged:
                raise UserError(f"report: no r3rag:results block of {', '.join(map(str, results))} in the docs")
            print(*written, f"{found} blocks up to date", sep="\n")  # the files written, then the count
            return
        overrides = [f"name={name}", f"screenshot={str(screenshot).lower()}"]
        overrides += [f"evals=[{','.join(evals)}]"] if evals else []
        ref = run_stage("report", None, overrides, runs_dir)
        print(ref.path)

    guard(go, debug)


def _merge_slices(results: list[Path]) -> int:
    """Merge each results file's slice files into it (r3rag.experiments.slices.merge); how many files were merged."""
    from r3rag.experiments.slices.merge import merge_into

    merged = 0
    for path in results:
        done = merge_into(path)
        if done:
            print(f"{path}: merged from {done[1]} slices of {done[0]}")
            merged += 1
    return merged


def eval_retrieval_cmd(
    questions: Annotated[
        Path,
        typer.Argument(
            help="Question JSONL (id, question, golden_answers, metadata with supporting_titles or paragraphs)."
        ),
    ],
    index: Annotated[
        str, typer.Option(help="Index artifact: index:latest, index:<id> or a directory.")
    ] = "index:latest",
    ks: Annotated[str, typer.Option(help="Comma-separated k values.")] = "1,3,5,10",
    limit: Annotated[int, typer.Option(help="First N questions (0 = all).")] = 0,
    hop_queries: Annotated[
        Path | None,
        typer.Option(help="JSONL of {id, queries: [...]}: also score the union of these hop queries' results."),
    ] = None,
    runs_dir: RunsOpt = None,
    debug: DebugOpt = False,
):
    """Retrieval quality: recall@k of gold supporting passages and answer-recall@k, single-shot with
    the question text (and for given hop queries). Prints a table, then one line of JSON."""

    def go():
        import json

        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        from r3rag.core.artifacts import default_runs_dir, resolve
        from r3rag.retrieval import load_retriever
        from r3rag.retrieval.evaluate import load_hop_queries, retrieval_metrics
        from r3rag.stages.common import load_questions

        art = resolve(index, "index", runs_dir or default_runs_dir())
        qs = load_questions(questions, limit=limit)
        hops = None
        if hop_queries:
            by_id = load_hop_queries(hop_queries)
            hops = [by_id.get(q["id"], []) for q in qs]
        try:
            k_values = tuple(int(k) for k in ks.split(","))
        except ValueError:
            raise UserError(f"--ks {ks!r}: expected comma-separated integers") from None
        m = retrieval_metrics(load_retriever(art.path / "index"), qs, ks=k_values, hop_queries=hops)
        title = f"retrieval: {art.id} on {questions.name} (n={m['n']}, with gold passages: {m['n_gold']})"
        table = Table(title=Text(title))  # Text: the file's name printed as it is, not as markup
        table.add_column("metric")
        for k in k_values:
            table.add_column(f"@{k}", justify="right")
        for name in [p + base for p in ("", "hops_") for base in ("recall", "answer_recall")]:
            if f"{name}@{k_values[0]}" in m:
                table.add_row(name, *(f"{m[f'{name}@{k}']:.3f}" for k in k_values))
        Console(stderr=True).print(table)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()}))

    guard(go, debug)


def import_model_cmd(
    source: Annotated[
        str,
        typer.Argument(
            help="A packaged model (smollm2-135m-instruct), a .gguf file, or a hub id / model directory (recorded, not copied)."
        ),
    ] = "smollm2-135m-instruct",
    set_: SetOpt = None,
    runs_dir: RunsOpt = None,
    debug: DebugOpt = False,
):
    """A GGUF file (or a packaged model) as a versioned `model` artifact: `r3rag model --set source=SOURCE`.

    Prints the artifact's path; other stages take it as `model: model:latest`.
    """

    def go():
        from r3rag.experiments.pipeline import run_stage

        print(run_stage("model", None, [f"source={source}", *(set_ or [])], runs_dir).path)

    guard(go, debug)


def import_cmd(
    input: Annotated[Path, typer.Argument(help="QA file: a JSON list (original datasets) or JSONL.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Question JSONL to write (r3rag / FlashRAG schema).")],
    format: Annotated[str, typer.Option("--format", "-f", help="auto, hotpotqa, 2wiki, musique or flashrag.")] = "auto",
    corpus_out: Annotated[
        Path | None,
        typer.Option(
            "--corpus-out", help="Also write the context paragraphs as a deduplicated {id, title, text} corpus."
        ),
    ] = None,
    limit: Annotated[int, typer.Option(help="First N questions (0 = all).")] = 0,
    debug: DebugOpt = False,
):
    """Convert a HotpotQA, 2WikiMultiHopQA, MuSiQue or FlashRAG file into r3rag's question JSONL
    (`id`, `question`, `golden_answers`, `metadata` with `supporting_titles`, `paragraphs`, `hops`).

    With `--corpus-out`, the context paragraphs become a corpus for
    `r3rag index --set corpus=CORPUS.jsonl --set world=`. Prints a summary on stderr and the output path.
    """

    def go():
        from r3rag.data.importers import corpus_from_questions, import_questions, write_atomic

        paths = [input.resolve(), out.resolve()] + ([corpus_out.resolve()] if corpus_out else [])
        if len(set(paths)) != len(paths):
            raise UserError(f"{input}: INPUT, --out and --corpus-out must be different files")
        questions, fmt = import_questions(input, format, limit)
        outputs = {out: questions}
        summary = f"imported {len(questions)} questions ({fmt}) -> {out}"
        if corpus_out:
            outputs[corpus_out] = corpus_from_questions(questions)
            if not outputs[corpus_out]:  # an empty corpus would only fail later, in `r3rag index`
                raise UserError(f"{input}: --corpus-out: the questions have no context paragraphs")
            summary += f"; {len(outputs[corpus_out])} unique paragraphs -> {corpus_out}"
        write_atomic(outputs)
        print(summary, file=sys.stderr)
        print(out)

    guard(go, debug)


def serve_retriever_cmd(
    index: Annotated[
        str, typer.Option("--index", help="Index artifact: index:latest, index:ID or a path.")
    ] = "index:latest",
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind (0.0.0.0 exposes it to the network).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Most queries one request may send.")] = 512,
    max_topk: Annotated[int, typer.Option("--max-topk", help="Largest topk a request may ask for.")] = 100,
    header_timeout: Annotated[
        float,
        typer.Option(
            "--header-timeout",
            help="Seconds a connection has to send a request's headers (and its body), else it is closed.",
        ),
    ] = 10.0,
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Server processes on the one port (SO_REUSEPORT); they share the memory-mapped index.",
        ),
    ] = 1,
    runs_dir: RunsOpt = None,
    debug: DebugOpt = False,
):
    """Serve an index over HTTP (Search-R1's `POST /retrieve`, plus `GET /health`), batching concurrent requests.

    Stages search through it with `--set retriever=http://HOST:PORT` (and `--set index=`).
    """

    def go():
        from r3rag.core.artifacts import resolve
        from r3rag.retrieval.serving import serve

        if max_batch < 1 or max_topk < 1 or header_timeout <= 0 or workers < 1:
            raise UserError(
                "serve-retriever: --max-batch, --max-topk and --workers must be at least 1, --header-timeout above 0"
            )
        art = resolve(index, "index", runs_dir)
        serve(
            art.path / "index",
            host=host,
            port=port,
            workers=workers,
            max_batch=max_batch,
            max_topk=max_topk,
            header_timeout=header_timeout,
            body_timeout=header_timeout,
        )

    guard(go, debug)


def runs_cmd(
    stage: Annotated[str | None, typer.Argument(help="Only this stage.")] = None,
    runs_dir: RunsOpt = None,
    debug: DebugOpt = False,
):
    """List complete artifacts (incomplete directories have no manifest and are not shown)."""

    def go():
        from r3rag.experiments.pipeline import list_runs

        list_runs(stage, runs_dir)

    guard(go, debug)


def serve_vllm_cmd(
    model: Annotated[
        str,
        typer.Option(
            "--model", help="The policy: sft:latest, rl:ID, model:latest (any STAGE:REF), or a model path / hub id."
        ),
    ] = "sft:latest",
    host: Annotated[
        str, typer.Option("--host", help="Interface to bind (0.0.0.0 exposes it to the network).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    max_model_len: Annotated[
        int, typer.Option("--max-model-len", help="Longest trajectory in tokens (0: the model's own context).")
    ] = 0,
    dtype: Annotated[
        str, typer.Option("--dtype", help="auto: fp32 on the CPU (as the trainer), the model's own on a GPU.")
    ] = "auto",
    gpu_memory: Annotated[
        float, typer.Option("--gpu-memory", help="On a GPU: the share of its memory vLLM takes.")
    ] = 0.9,
    kv_cache_gb: Annotated[
        float, typer.Option("--kv-cache-gb", help="On the CPU: RAM for the KV cache, in GiB.")
    ] = 2.0,
    runs_dir: RunsOpt = None,
    debug: DebugOpt = False,
):
    """Serve a policy with vLLM for GRPO's server mode (`--set vllm=server --set vllm_server_url=http://HOST:PORT`).

    vLLM's OpenAI server with the routes TRL's weight sync calls, and its weight transfer: NCCL on a
    GPU, gloo on the CPU (vLLM's CPU build). Runs until stopped (Ctrl-C).
    """

    def go():
        import os

        from r3rag.generation.vllm import on_gpu, require_vllm
        from r3rag.generation.vllm_server import serve_command

        require_vllm("serve-vllm")
        if port < 1 or max_model_len < 0:
            raise UserError("serve-vllm: --port must be at least 1 and --max-model-len at least 0")
        path = _policy_path(model, runs_dir)
        argv, env = serve_command(path, host, port, max_model_len, dtype, gpu_memory, kv_cache_gb, gpu=on_gpu())
        print(f"serve-vllm: {path} on http://{host}:{port}", file=sys.stderr, flush=True)
        os.execve(argv[0], argv, {**os.environ, **env})  # vLLM's server in this process: Ctrl-C reaches it

    guard(go, debug)


def _policy_path(model: str, runs_dir) -> str:
    """A STAGE:REF artifact's weights directory (or the model its model.json names), else `model` as given."""
    stage, _, ref = model.partition(":")
    if not ref or stage not in ("model", "base", "sft", "rl"):
        return model
    from r3rag.core.artifacts import resolve
    from r3rag.stages.common import model_location

    return model_location(model, {stage: resolve(model, stage, runs_dir)}, key=stage)
