"""Pipelines and experiments: `pipeline` (stages in order, each reused when built), `experiment`
(variants + one table), `run` (what `r3rag run FILE` builds), `jobs` (variants in worker
processes), `seeds`, `status` (`run --status`), the slices of a long experiment (`slices`, `slice_file`,
`slice_merge`, `slice_status`) and `results/` (the table, its comparisons, the results file and
the docs' tables).

May import stages/ and everything below it; only cli/ imports it.
"""
