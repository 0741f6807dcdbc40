"""r3rag: train language models to reason and retrieve step by step.

Stages (each a CLI subcommand and a module in `r3rag.stages`):
world -> index -> synthesize -> sft -> rl -> eval. See README.md.

Packages, top to bottom; each imports only those below it: cli, experiments, stages, rl,
evaluation and synthesis, training / generation / retrieval, data, core, util
(docs/development.md#layout; each package's docstring says what it holds).
"""

__version__ = "0.1.0"
