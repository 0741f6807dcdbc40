"""One module per pipeline stage, each with a typed `Config` dataclass and `run(cfg, ctx) -> ArtifactRef`.

`INPUTS` in each module maps config fields that name input artifacts to the stage they must come from;
an optional `validate(cfg)` checks a config before anything is loaded (`r3rag run --dry-run`).

This module is the stage registry: `STAGES` names every stage with its one-line summary, and
`stage_module` is the one place a name becomes its module. A stage module is imported on first
use: `r3rag --help` lists the stages by their summaries without importing any of them.

Usage:
    from r3rag.stages import STAGE_ORDER, STAGES, stage_module
    module = stage_module("sft")            # r3rag.stages.sft
    cfg = module.Config(epochs=2)
    STAGES["sft"]                           # the first paragraph of r3rag.stages.sft's docstring
    stage_module("sfx")                     # UserError: unknown stage 'sfx' (known: model, world, ...)

A stage wires the packages below it (rl/, evaluation/, synthesis/, training/, generation/,
retrieval/, data/, core/, util/) into one artifact; experiments/ and cli/ run the stages.
"""

from __future__ import annotations

from types import ModuleType

from r3rag.util.errors import UserError

# The order a pipeline runs its stages in (`r3rag run`); `report` reads eval artifacts and is run on its own.
STAGE_ORDER = ("model", "world", "index", "synthesize", "base", "sft", "rl", "eval")

# Every stage and the first paragraph of its module's docstring (tests/test_stage_registry.py keeps
# them equal): what `r3rag --help` shows for it.
STAGES = {
    "model": "`r3rag model` (also `r3rag import-model SOURCE`): a pretrained model as a versioned artifact.",
    "world": "`r3rag world`: generate the embedded synthetic world (corpus + 2- to 4-hop questions).",
    "index": "`r3rag index`: build a retrieval index over a corpus into a versioned artifact.",
    "synthesize": "`r3rag synthesize`: teacher trajectories for the SFT cold start (R3-RAG's attempt loop).",
    "base": "`r3rag base`: a small base model pretrained on world text, for a LoRA cold start like real runs.",
    "sft": "`r3rag sft`: supervised cold start on teacher trajectories with TRL's SFTTrainer.",
    "rl": "`r3rag rl`: GRPO (or PPO with a critic, RLOO, REINFORCE++: `algorithm`, r3rag.rl.ppo) with\nTRL's GRPOTrainer and a multi-turn `rollout_func`.",
    "eval": "`r3rag eval`: EM/F1 of several systems on held-out questions, through the same rollout loop.",
    "report": "`r3rag report`: one table over several eval artifacts, plus a bar chart and a trajectory viewer.",
}


def stage_module(name: str) -> ModuleType:
    """The module of stage `name`, imported now if it was not yet. Spelled out case by case rather
    than built from the name, so a reader (and a linter) can follow each stage to its module."""
    match name:
        case "model":
            from r3rag.stages import model as module
        case "world":
            from r3rag.stages import world as module
        case "index":
            from r3rag.stages import index as module
        case "synthesize":
            from r3rag.stages import synthesize as module
        case "base":
            from r3rag.stages import base as module
        case "sft":
            from r3rag.stages import sft as module
        case "rl":
            from r3rag.stages import rl as module
        case "eval":
            from r3rag.stages import eval as module
        case "report":
            from r3rag.stages import report as module
        case _:
            raise UserError(f"unknown stage {name!r} (known: {', '.join(STAGES)})")
    return module
