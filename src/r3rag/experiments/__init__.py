"""Pipelines and experiments: `pipeline` (stages in order, each reused when built), `experiment`
(variants + one table), `seeds`, `run` (what `r3rag run FILE` builds), `jobs` (variants in worker
processes); `results/` (the table, its comparisons, the results file and the docs' tables),
`slices/` (a long experiment in units of work, their files and their merge) and `status/`
(`run --status`: how far a file has got, building nothing).

Inside, each imports only those below it: run, jobs and status/; slices/; experiment; pipeline,
seeds and results/. May import stages/ and everything below it; only cli/ imports it.
"""
