"""Library noise off unless `r3rag --verbose`: Hugging Face progress bars, logging and FutureWarnings.

r3rag's own output stays: one line per stage (`sft: wrote ...`), progress over a stage's long loop
(r3rag.util.progress: a rich display on a terminal, plain lines with rate and ETA in a log file; through
r3rag.stages.common.Context.progress, and r3rag.training.observe.StepProgress for training).
What goes is what the libraries print on their own: transformers' "Loading weights" and "Writing
model shards" bars, datasets' map bars ("Truncating train dataset ... examples/s"), the Trainer's
tqdm bar and the dicts it prints, TRL's and transformers' FutureWarnings and log warnings.

The CLI calls `configure` before any stage imports those libraries, so the environment variables
they read at import time do the work; a library imported earlier (a test, a notebook) is switched
off through its public functions instead. A Python user who never calls `configure` keeps every
library's own settings.

Usage:
    from r3rag.util import quiet
    quiet.configure(verbose=False)   # r3rag's CLI, on every command (`--verbose` -> True)
    quiet.is_verbose()               # False: stages show StepProgress instead of the Trainer's tqdm
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

# Read by each library when it is imported; setdefault, so a user's own setting wins.
LIBRARY_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # also transformers' bars: "Loading weights", "Writing model shards"
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # datasets' map bars: "Truncating train dataset", "examples/s"
    "TRANSFORMERS_VERBOSITY": "error",
    "DATASETS_VERBOSITY": "error",
    "HF_HUB_VERBOSITY": "error",
    "ACCELERATE_LOG_LEVEL": "error",  # loggers made by accelerate.logging.get_logger: accelerate's and TRL's
    # Plain tqdm bars the switches above miss (transformers' GGUF conversion); r3rag's own bars are rich.
    "TQDM_DISABLE": "1",
    # vLLM logs each engine start in ~60 INFO lines (its engine core, a spawned process, reads this
    # too), and warns at each shutdown that it force-killed its engine core: errors only.
    "VLLM_LOGGING_LEVEL": "ERROR",
}
# Whatever vLLM logs goes to stderr, verbose or not: stdout is the artifact's path, what scripts read
# (vLLM's default is stdout). Its engine core, a spawned process, reads this too.
STREAM_ENV = {"VLLM_LOGGING_STREAM": "ext://sys.stderr"}
LIBRARY_LOGGERS = ("transformers", "trl", "datasets", "accelerate", "huggingface_hub", "peft", "torch")
# UserWarnings raised inside these packages are theirs to fix, not the user's; ours (r3rag.*) still show.
LIBRARY_MODULES = r"(torch|transformers|trl|datasets|accelerate|peft|huggingface_hub)(\.|$)"

_verbose = True  # until the CLI says otherwise: a library user keeps the libraries' own output


def is_verbose() -> bool:
    return _verbose


def configure(verbose: bool) -> None:
    """Verbose: leave every library as it is. Else silence their bars, warnings and logging."""
    global _verbose
    _verbose = verbose
    for key, value in STREAM_ENV.items():
        os.environ.setdefault(key, value)
    if verbose:
        return
    for key, value in LIBRARY_ENV.items():
        os.environ.setdefault(key, value)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # FutureWarnings name the caller's line (often ours, calling TRL), so they are matched by category.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=LIBRARY_MODULES)
    _silence_imported()


def _silence_imported() -> None:
    """Libraries imported before `configure` read their environment variables already."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
