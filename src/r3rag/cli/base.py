"""What every `r3rag` command is built from: its options, its help and its error handling.

Usage (in r3rag.cli and r3rag.cli.commands):
    app.command("sft", cls=StageCommand, short_help=STAGES["sft"])(command)  # help: the stage's docstring
    app.command("report", cls=StageSettings)(report_cmd)  # help ends with the stage's settings

    def command(config: ConfigOpt = None, set_: SetOpt = None, debug: DebugOpt = False):
        guard(lambda: ..., debug)  # a UserError: one line on stderr, exit code 2

Help is cheap: a stage's help and settings are read from its module when shown (`StageCommand`,
`StageSettings`), never when the CLI starts, and rich is imported only to print an error.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from r3rag.stages import stage_module
from r3rag.util.errors import UserError


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


def guard(fn, debug: bool):
    """Run a command; user errors (and a full or read-only disk) become one line on stderr and exit code 2."""
    from r3rag.core.artifacts import WRITE_ERRNOS

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


class StageSettings(TyperCommand):
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


class StageCommand(StageSettings):
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
