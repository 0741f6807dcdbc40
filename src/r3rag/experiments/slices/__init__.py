"""A long experiment in units of work small enough that a lost machine costs at most one: `cut`
(the pipeline's `slices` section, each slice's variants and settings fingerprint, the experiment
cut to one slice), `file` (`r3rag run FILE --slice NAME` and the file it writes, which outlives the
machine) and `merge` (the slices' files into the experiment's results file).

Usage:
    from r3rag.experiments.slices.cut import load_slices, slice_experiment
    from r3rag.experiments.slices.merge import merge_into   # `r3rag report --results`' first step

May import experiment, pipeline, seeds and results/ (and stages/ and below); run, jobs and
status/ build on it.
"""
