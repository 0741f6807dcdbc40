"""`r3rag run FILE --status`: how far a pipeline or an experiment has got, building nothing.
`stages` (each stage's artifact: done, in progress, to do or waiting, and the hours left), `so_far`
(the table and its comparisons over the seeds finished so far) and `slices` (an experiment with
slices: which slice files are committed, written, stale or missing, and its table from them).

Usage:
    from r3rag.experiments.status.stages import file_status, print_status
    from r3rag.experiments.status.slices import print_slice_status

May import everything else in experiments/ (and stages/ and below); only cli/ imports it.
"""
