"""r3rag: train language models to reason and retrieve step by step.

Stages (each a CLI subcommand and a module in `r3rag.stages`):
world -> index -> synthesize -> sft -> rl -> eval. See README.md.
"""

__version__ = "0.1.0"
