"""The `r3rag` command line: one subcommand per stage, plus `run` (a whole pipeline), `runs` and the rest.

Usage:
    r3rag world --seed 7
    r3rag sft --config pipelines/demo.yaml --set epochs=2
    r3rag run pipelines/demo.yaml --set world.seed=7
    r3rag --verbose sft              # also the libraries' own progress bars, warnings and logs
    r3rag runs
    r3rag serve-retriever --index index:latest --port 8000
    r3rag serve-vllm --model sft:latest --port 8001   # GRPO's rl.vllm=server

This module is the app: its global options, a command per stage and the list of the commands, in the
order `r3rag --help` shows them. The options, the help classes and the error guard every command uses
are in r3rag.cli.base; the commands that are not a stage in r3rag.cli.commands (`run` in r3rag.cli.run);
`r3rag data fetch|list` in r3rag.cli.data.

`r3rag --help` and `r3rag <stage> --help` take a fraction of a second: the CLI imports no stage
module (a stage's help is read from its module when shown: `base.StageCommand`), and a stage module
imports torch, transformers, TRL and datasets inside the functions that use them, never at its top
or at the top of what it imports (tests/test_cli_speed.py). Help is click's plain formatter, not Typer's
rich one, and rich is imported only by the commands that print with it.
"""

from __future__ import annotations

import os
import sys

import typer

from r3rag.cli import commands, data, run
from r3rag.cli.base import (
    ConfigOpt,
    DebugOpt,
    HelpOpt,
    ResumeOpt,
    RunsOpt,
    SeedOpt,
    SetOpt,
    StageCommand,
    StageSettings,
    VerboseOpt,
    guard,
)
from r3rag.stages import STAGE_ORDER, STAGES

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
    add_help_option=False,  # the app's --help is `_options`' HelpOpt (cli.base)
)


@app.callback()
def _options(verbose: VerboseOpt = False, help: HelpOpt = False):
    # No docstring: Typer would show it in place of the app's help.
    from r3rag.util import quiet

    quiet.configure(verbose)  # before any command imports transformers, TRL or datasets


def _stage_command(stage: str):
    def command(
        config: ConfigOpt = None,
        set_: SetOpt = None,
        seed: SeedOpt = None,
        runs_dir: RunsOpt = None,
        debug: DebugOpt = False,
    ):
        def go():
            from r3rag.experiments.pipeline import run_stage

            overrides = list(set_ or []) + ([f"seed={seed}"] if seed is not None else [])
            ref = run_stage(stage, config, overrides, runs_dir)
            if os.environ.get("RANK", "0") == "0":  # under accelerate launch, one line from the main process
                print(ref.path)

        guard(go, debug)

    return command


def _resumable_command(stage: str):
    """`base`, `sft` and `rl` resume from checkpoints: `--resume` is `--set resume=true`."""
    base = _stage_command(stage)

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


RESUMABLE = ("base", "sft", "rl")  # the stages whose Trainer checkpoints a killed run resumes from


for _stage in STAGE_ORDER:
    _command = _resumable_command(_stage) if _stage in RESUMABLE else _stage_command(_stage)
    app.command(_stage, cls=StageCommand, short_help=STAGES[_stage])(_command)


# The other commands, in this order in `r3rag --help`.
app.command("report", cls=StageSettings)(commands.report_cmd)
app.command("eval-retrieval")(commands.eval_retrieval_cmd)
app.command("import-model")(commands.import_model_cmd)
app.command("import")(commands.import_cmd)
app.command("run")(run.run_cmd)
app.command("serve-retriever")(commands.serve_retriever_cmd)
app.command("serve-vllm")(commands.serve_vllm_cmd)
app.command("runs")(commands.runs_cmd)
app.add_typer(data.app, name="data")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
