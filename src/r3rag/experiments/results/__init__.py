"""An experiment's table and what is made of it: `table` (rows from eval artifacts, as Markdown
and a chart), `compare` (paired comparisons between rows, and the claims they test), `file` (the
results file, the table as data) and `docs` (the docs' tables generated from results files).

Usage:
    from r3rag.experiments.results.table import build_rows, markdown
    from r3rag.experiments.results.docs import update_docs   # `r3rag report --results`

May import stages/ and everything below it; in experiments/ it imports nothing: the experiment,
its slices and `run --status` build on it.
"""
