"""One module per pipeline stage, each with a typed `Config` dataclass and `run(cfg, ctx) -> ArtifactRef`.

`INPUTS` in each module maps config fields that name input artifacts to the stage they must come from.
"""

STAGE_ORDER = ("model", "world", "index", "synthesize", "base", "sft", "rl", "eval")
