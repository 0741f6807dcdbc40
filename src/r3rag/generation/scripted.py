"""Scripted generators: fixed texts for tests, or a function of the trajectory (the oracle teacher).

Usage:
    gen = ScriptedGenerator(lambda traj: "<answer> Velmar </answer>", tokenizer=None)
"""

from __future__ import annotations

from collections.abc import Callable

from r3rag.core.env import Generated, Trajectory


class ScriptedGenerator:
    def __init__(self, script: Callable[[Trajectory], str], tokenizer=None):
        self.script, self.tokenizer = script, tokenizer

    def generate(self, contexts: list[Trajectory], stop: tuple[str, ...], max_new_tokens: int) -> list[Generated]:
        outs = []
        for ctx in contexts:
            text = self.script(ctx)
            finish = "stop"
            # Honour the stop strings like a real model would: cut right after the first one.
            cuts = [text.index(s) + len(s) for s in stop if s in text]
            if cuts:
                text = text[: min(cuts)]
            ids = None if self.tokenizer is None else self.tokenizer.encode(text, add_special_tokens=False)
            if ids is not None and len(ids) > max_new_tokens:
                ids, finish = ids[:max_new_tokens], "length"
                text = self.tokenizer.decode(ids)
            outs.append(Generated(text, ids, finish))
        return outs
