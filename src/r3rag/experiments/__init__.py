"""Pipelines and experiments: `pipeline` (stages in order, each reused when built), `experiment`
(variants + one table), `run` (what `r3rag run FILE` builds), `jobs` (variants in worker
processes), `seeds`, `status` (`run --status`), `slice_status` (its view of an experiment's
slices), `results/` (the table, its comparisons, the results file and the docs' tables) and
`slices/` (a long experiment in units of work, their files and their merge).

May import stages/ and everything below it; only cli/ imports it.
"""
