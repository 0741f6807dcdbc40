"""How long the default synthetic world takes to generate, against its 2 s budget.

`r3rag world` runs before every pipeline, and the tests build worlds many times, so the default
world (2400 people, 480 companies...; ~8,900 documents) should stay well under 2 s on one core.
A timing belongs here, not in the tests: on a shared CI machine it fails for reasons that are not
the code's. Best of `--repeats` runs.

Usage:
    python benchmarks/world_speed.py [--repeats 3] [--seed 0]
Last line: {"world_default_seconds": ..., "world_budget_ratio": ... (seconds / 2 s; < 1 is within), ...}
"""

from __future__ import annotations

import argparse
import json
import time

from r3rag.data.world import WorldConfig, generate_world

BUDGET_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    times = []
    for _ in range(max(1, args.repeats)):
        start = time.perf_counter()
        world = generate_world(WorldConfig(seed=args.seed))
        times.append(time.perf_counter() - start)
    best = min(times)
    print(f"default world: {len(world.docs)} documents, {len(world.train)} train / {len(world.test)} test questions")
    print(f"best of {len(times)}: {best:.3f} s (budget {BUDGET_S:.1f} s)")
    figures = {
        "world_default_seconds": round(best, 3),
        "world_budget_ratio": round(best / BUDGET_S, 3),
        "docs": len(world.docs),
        "repeats": len(times),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
