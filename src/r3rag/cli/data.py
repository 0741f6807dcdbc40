"""`r3rag data`: the real QA sets the real pipelines read, fetched from the Hugging Face hub.

Usage:
    r3rag data list                       # every data set, its size, what the data root holds
    r3rag data fetch                      # the default set (HotpotQA, MuSiQue, 2Wiki): `make data`
    r3rag data fetch nq triviaqa popqa    # named sets; `all` = every QA set
    r3rag data fetch wiki18 --yes         # the 21M-passage wiki-18 corpus (5.1 GB), only on request
    r3rag data fetch --if-missing         # nothing when a data root is there (make real's prerequisite)

r3rag.cli adds this group to the app; each command imports what it runs inside its body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from r3rag.cli.base import DebugOpt, HelpOpt, guard
from r3rag.util.errors import UserError

app = typer.Typer(
    help="The real QA sets (FlashRAG's files on the Hugging Face hub, pinned in data/flashrag.json): "
    "fetch them into one data root the pipelines read, or list them.",
    no_args_is_help=True,
    rich_markup_mode=None,
    add_help_option=False,
)

RootOpt = Annotated[
    Path | None,
    typer.Option("--root", help="The data root to write (default: $R3RAG_DATA, else data/fetched in a checkout)."),
]
ManifestOpt = Annotated[
    Path | None, typer.Option("--manifest", help="Another manifest (default: the checkout's data/flashrag.json).")
]


@app.callback()
def _group(help: HelpOpt = False):
    pass


@app.command("fetch")
def fetch_cmd(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Data sets (r3rag data list); none = the default set; `all` = every QA set."),
    ] = None,
    root: RootOpt = None,
    manifest: ManifestOpt = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Fetch a set fetched only on request without asking.")
    ] = False,
    if_missing: Annotated[
        bool,
        typer.Option(
            "--if-missing",
            help="Do nothing when the pipelines already have a data root ($R3RAG_DATA, or a fetched copy "
            "that holds the sets).",
        ),
    ] = False,
    debug: DebugOpt = False,
):
    """Download data sets from the Hugging Face hub at the manifest's pinned commit (resumable: a rerun
    continues a cut download; each file checked against its sha256), and write the files the pipelines
    read. Honours HF_ENDPOINT, HF_HUB_OFFLINE and HF_TOKEN. Prints the data root."""

    def go():
        from r3rag.data.fetch import ensure, fetch

        if if_missing:
            if root:
                raise UserError("data fetch: --if-missing looks where the pipelines read; it takes no --root")
            print(ensure(list(names or []), manifest))
            return
        print(fetch(list(names or []), root, manifest, yes=yes))

    guard(go, debug)


@app.command("list")
def list_cmd(root: RootOpt = None, manifest: ManifestOpt = None, debug: DebugOpt = False):
    """Every data set the manifest knows: its download size, whether the data root holds it, what it is."""

    def go():
        from r3rag.data.fetch import print_status

        print_status(root, manifest)

    guard(go, debug)
