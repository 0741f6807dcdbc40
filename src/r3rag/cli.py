"""The `r3rag` command line: one subcommand per stage, plus `run` (a whole pipeline) and `runs`.

Usage:
    r3rag world --seed 7
    r3rag sft --config pipelines/demo.yaml --set epochs=2
    r3rag run pipelines/demo.yaml --set world.seed=7
    r3rag --verbose sft              # also the libraries' own progress bars, warnings and logs
    r3rag runs
    r3rag serve-retriever --index index:latest --port 8000

`r3rag --help` and `r3rag <stage> --help` take a fraction of a second: this module imports no stage
module (a stage's help is read from its module when shown: `_StageCommand`), and a stage module
imports torch, transformers, TRL and datasets inside the functions that use them, never at its top
or at the top of what it imports (tests/test_cli_speed.py). Help is click's plain formatter, not Typer's
rich one, and rich is imported only by the commands that print with it.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from r3rag.errors import UserError
from r3rag.stages import STAGE_ORDER, STAGES, stage_module

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

app = typer.Typer(
    help="Train language models to reason and retrieve step by step.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Plain click help, not Typer's rich formatter: importing that (rich's console, markdown, tables) takes
    # ~0.29 s, as long as the 0.3 s help may take (issue 19.3). Help texts stay Markdown for docs/cli.md.
    rich_markup_mode=None,
    add_help_option=False,  # the app's --help is `_options`' HelpOpt (see `_show_help`)
)


def _show_help(ctx: typer.Context, value: bool) -> None:
    """The app's own --help, as Typer's. Typer's leaves its value None when not given, and turning
    None into a bool imports pydantic: about a quarter of `r3rag <stage> --help`'s time."""
    if value and not ctx.resilient_parsing:
        typer.echo(ctx.get_help())
        raise typer.Exit()


HelpOpt = Annotated[
    bool,
    typer.Option("--help", is_eager=True, expose_value=False, callback=_show_help, help="Show this message and exit."),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Also show what the libraries print: Hugging Face progress bars, warnings and logs (before the command).",
    ),
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="Pipeline YAML; this stage's section is used.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a config key: KEY=VALUE (repeatable).")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Shortcut for --set seed=N.")]
RunsOpt = Annotated[
    Path | None, typer.Option("--runs-dir", help="Where artifacts live (default: runs/ or $R3RAG_RUNS).")
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint (same settings).")]


@app.callback()
def _options(verbose: VerboseOpt = False, help: HelpOpt = False):
    # No docstring: Typer would show it in place of the app's help.
    from r3rag import quiet

    quiet.configure(verbose)  # before any command imports transformers, TRL or datasets


def _guard(fn, debug: bool):
    """Run a command; user errors (and a full or read-only disk) become one line on stderr and exit code 2."""
    from r3rag.artifacts import WRITE_ERRNOS

    try:
        return fn()
    except (UserError, OSError) as e:
        if debug or (isinstance(e, OSError) and e.errno not in WRITE_ERRNOS | {errno.EACCES}):
            raise
        msg = str(e) if isinstance(e, UserError) else f"{e.filename or 'write'}: {e.strerror or e}"
        _stderr_line(("error:", "bold red"), " " + msg)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        _stderr_line(("interrupted", "yellow"), ": nothing incomplete was published")
        raise typer.Exit(130) from None


def _stderr_line(*parts) -> None:
    """One line on stderr, its text printed as it is: a message names the user's files, in which
    rich would read `[x]` as markup and `:100:` (a line number) as an emoji."""
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True, soft_wrap=True).print(Text.assemble(*parts))


class _StageSettings(TyperCommand):
    """A command whose --help ends with its stage's settings and their defaults (what `--set`
    accepts), read from the stage's module when the help is shown, not when the CLI starts."""

    @property
    def epilog(self) -> str:
        import dataclasses

        cfg = stage_module(self.name).Config()
        keys = ", ".join(f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg))
        return f"Config keys (--set key=value; defaults): {keys}"

    @epilog.setter
    def epilog(self, _) -> None:  # Typer sets one in __init__: the property above is the epilog
        pass


class _StageCommand(_StageSettings):
    """A stage's command: its help is the stage module's docstring, read when shown. `r3rag --help`
    lists it by its summary in the registry (`short_help`), importing no stage module."""

    @property
    def help(self) -> str:
        return stage_module(self.name).__doc__

    @help.setter
    def help(self, _) -> None:
        pass

    def format_help_text(self, ctx, formatter) -> None:
        """The docstring line for line: click would join its lists and usage examples into one paragraph."""
        formatter.write_paragraph()
        with formatter.indentation():
            for line in (self.help or "").strip().splitlines():
                formatter.write(f"{' ' * formatter.current_indent}{line}\n" if line.strip() else "\n")


def _stage_command(stage: str):
    def command(
        config: ConfigOpt = None,
        set_: SetOpt = None,
        seed: SeedOpt = None,
        runs_dir: RunsOpt = None,
        debug: DebugOpt = False,
    ):
        def go():
            from r3rag.pipeline import run_stage

            overrides = list(set_ or []) + ([f"seed={seed}"] if seed is not None else [])
            ref = run_stage(stage, config, overrides, runs_dir)
            print(ref.path)

        _guard(go, debug)

    return command


def _rl_command():
    """`rl` is the one stage that resumes: `--resume` is `--set resume=true`."""
    base = _stage_command("rl")

    def command(
        config: ConfigOpt = None,
        set_: SetOpt = None,
        seed: SeedOpt = None,
        resume: ResumeOpt = False,
        runs_dir: RunsOpt = None,
        debug: DebugOpt = False,
    ):
        base(config, list(set_ or []) + (["resume=true"] if resume else []), seed, runs_dir, debug)

    return command


for _stage in STAGE_ORDER:
    _command = _rl_command() if _stage == "rl" else _stage_command(_stage)
    app.command(_stage, cls=_StageCommand, short_help=STAGES[_stage])(_command)


@app.command("report", cls=_StageSettings)
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
            "(`<!-- r3rag:results FILE TABLE -->` markers; repeatable)."
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
        from r3rag.pipeline import run_stage

        if results or docs:
            from r3rag.results_docs import doc_files, update_docs

            if evals or not results:
                raise UserError("report: --results regenerates the docs and takes no eval artifacts; --docs needs it")
            written, found = update_docs(docs or doc_files(Path.cwd()), Path.cwd(), results)
            if not found:
                raise UserError(f"report: no r3rag:results block of {', '.join(map(str, results))} in the docs")
            print(*written, f"{found} blocks up to date", sep="\n")  # the files written, then the count
            return
        overrides = [f"name={name}", f"screenshot={str(screenshot).lower()}"]
        overrides += [f"evals=[{','.join(evals)}]"] if evals else []
        ref = run_stage("report", None, overrides, runs_dir)
        print(ref.path)

    _guard(go, debug)


@app.command("eval-retrieval")
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

        from r3rag.artifacts import default_runs_dir, resolve
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

    _guard(go, debug)


@app.command("import-model")
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
        from r3rag.pipeline import run_stage

        print(run_stage("model", None, [f"source={source}", *(set_ or [])], runs_dir).path)

    _guard(go, debug)


@app.command("import")
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

    _guard(go, debug)


@app.command("run")
def run_cmd(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML (e.g. pipelines/demo.yaml).")],
    set_: SetOpt = None,
    runs_dir: RunsOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate the whole config and print the plan; load and write nothing.")
    ] = False,
    debug: DebugOpt = False,
):
    """Run a pipeline's stages in order, reusing any artifact that already exists for the same config and inputs.

    Overrides name the stage: --set world.seed=7 --set sft.epochs=2. The last line printed is
    the path of the final artifact. --dry-run checks every stage's config and prints the plan
    (inputs and non-default settings per stage) without loading data or weights.
    """

    def go():
        from r3rag.experiment import plan_file, run_file
        from r3rag.pipeline import print_plan

        if dry_run:
            print_plan(plan_file(pipeline, list(set_ or []), runs_dir), pipeline)
            print("dry run: the config is valid")
            return
        ref = run_file(pipeline, list(set_ or []), runs_dir)
        print(ref.path)

    _guard(go, debug)


@app.command("serve-retriever")
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
        from r3rag.artifacts import resolve
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

    _guard(go, debug)


@app.command("runs")
def runs_cmd(
    stage: Annotated[str | None, typer.Argument(help="Only this stage.")] = None,
    runs_dir: RunsOpt = None,
    debug: DebugOpt = False,
):
    """List complete artifacts (incomplete directories have no manifest and are not shown)."""

    def go():
        from r3rag.pipeline import list_runs

        list_runs(stage, runs_dir)

    _guard(go, debug)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
