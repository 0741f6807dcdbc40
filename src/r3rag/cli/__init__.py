"""The `r3rag` command (Typer): `app` (a subcommand per stage), `base` (shared options, help, the
one-line error guard), `commands` (report, import, serve-retriever...), `run` (`r3rag run`), `data`
(`r3rag data`). `python -m r3rag.cli` runs it.

The top layer: may import every package below it; nothing imports it.
"""
