"""Training curves across runs: how far each run fell below its own best, and one chart of all.

Search-R1's stability claim (its Table 3: GRPO converges faster but its reward can collapse, PPO
is steadier) is measured here on the curves slice files carry (r3rag.experiments.slices: each RL
run's reward per step and dev EM where it was evaluated):

- `largest_drop(values, window)`: the deepest fall of a curve below its best so far, after a
  moving average over `window` points (training reward is noisy step to step; dev EM, evaluated a
  few times, is taken as it is with window 1). 0 for a curve that never fell.
- `stability(curves)`: both drops for every run.
- `plot_curves(curves, png)`: training reward (smoothed) and dev EM per step, one colour per arm,
  one line per seed.
- `run_curve(rl_dir)`: an RL artifact's curve; one that started from another RL artifact's policy
  (`rl.policy=${earlier.rl}`: a long run built as a chain of shorter ones, each a slice) continues
  that one's curve, its steps counted on from the step it started from.

Usage:
    curves = {"PPO": {"0": [{"step": 1, "reward": 0.2, "dev_em": 0.5}, ...], "1": [...]}, "GRPO": {...}}
    stability(curves)    # {"PPO": {"0": {"reward_drop": 0.03, "dev_em_drop": 0.0}, ...}, ...}
    plot_curves(curves, Path("docs/replicate-ppo-curves.png"), title="...")
    run_curve(Path("runs/rl/<id>"))   # [{"step", "reward", "dev_em"?}, ...], earlier links first
"""

from __future__ import annotations

import json
from pathlib import Path

REWARD_WINDOW = 10  # steps the training reward is averaged over before its drop is read


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what there is)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def largest_drop(values: list[float], window: int = 1) -> float:
    """The largest (best so far - value) over the smoothed curve: how far it fell below its own peak."""
    best, drop = float("-inf"), 0.0
    for v in smoothed(values, window):
        best = max(best, v)
        drop = max(drop, best - v)
    return round(drop, 4)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def stability(curves: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict[str, float]]]:
    """{arm: {seed: {"reward_drop", "dev_em_drop", "best_dev_em", "last_dev_em"}}} for every run's curve."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for arm, runs in curves.items():
        for seed, rows in runs.items():
            _, reward = _series(rows, "reward")
            _, dev = _series(rows, "dev_em")
            out.setdefault(arm, {})[seed] = {
                "reward_drop": largest_drop(reward, REWARD_WINDOW),
                "dev_em_drop": largest_drop(dev),
                "best_dev_em": max(dev) if dev else None,
                "last_dev_em": dev[-1] if dev else None,
            }
    return out


def plot_curves(curves: dict[str, dict[str, list[dict]]], png: Path, title: str = "") -> bool:
    """Training reward (moving average over REWARD_WINDOW steps) and dev EM per step, one colour per
    arm and one line style per seed; False (a note, no file) without matplotlib."""
    from r3rag.util.extras import pyplot_or_skip

    plt = pyplot_or_skip(png.name)
    if plt is None:
        return False
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=110, sharex=True)
    styles = ["-", "--", ":", "-."]
    for colour, (arm, runs) in enumerate(curves.items()):
        for i, (seed, rows) in enumerate(sorted(runs.items())):
            label = f"{arm}, seed {seed}"
            steps, reward = _series(rows, "reward")
            top.plot(steps, smoothed(reward, REWARD_WINDOW), styles[i % 4], color=f"C{colour}", label=label, lw=1.4)
            steps, dev = _series(rows, "dev_em")
            bottom.plot(steps, dev, styles[i % 4], color=f"C{colour}", marker="o", ms=3, lw=1.4)
    top.set_ylabel(f"training reward\n(mean of {REWARD_WINDOW} steps)")
    bottom.set_ylabel("dev EM")
    bottom.set_xlabel("step")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=7, ncol=2, loc="best")
    if title:
        top.set_title(title)
    fig.tight_layout()
    fig.savefig(png, bbox_inches="tight")
    plt.close(fig)
    return True


def run_curve(rl_dir: Path) -> list[dict]:
    """Training reward per step and dev EM where it was evaluated: in training (metrics.jsonl's
    `dev/em`), else by a dev eval of the published policy (an eval artifact beside it in the runs
    dir, at the kept step). A run whose policy was another RL artifact's continues that run's curve
    up to the step whose weights it started from (that run's kept step: its last, or its best on
    dev), its own steps offset by it; its dev EM before its first step (the manifest's
    `start_dev_em`) fills that step's where none is there."""
    from r3rag.core.artifacts import load_manifest

    return _chain(rl_dir, load_manifest(rl_dir) or {}, None, _dev_eval_ems(rl_dir.parent.parent))


def _chain(rl_dir: Path, manifest: dict, upto: int | None, dev_ems: dict[str, float]) -> list[dict]:
    """run_curve of `rl_dir` (its manifest given), its own steps up to `upto` where given."""
    from r3rag.core.artifacts import load_manifest

    own = _own_points(rl_dir, manifest, upto, dev_ems.get(rl_dir.name))
    policy = (manifest.get("inputs") or {}).get("policy") or {}
    parent = rl_dir.parent / str(policy.get("id"))
    parent_manifest = load_manifest(parent) if policy.get("stage") == "rl" else None
    if parent_manifest is None:
        return own
    earlier = _chain(parent, parent_manifest, (parent_manifest.get("metrics") or {}).get("kept_step"), dev_ems)
    offset = earlier[-1]["step"] if earlier else 0
    start_em = (manifest.get("metrics") or {}).get("start_dev_em")
    if start_em is not None and earlier and "dev_em" not in earlier[-1]:
        earlier[-1] = {**earlier[-1], "dev_em": start_em}
    return earlier + [{**r, "step": r["step"] + offset} for r in own]


def _own_points(rl_dir: Path, manifest: dict, upto: int | None, evaluated: float | None) -> list[dict]:
    """The run's own steps (up to `upto`): reward, and dev EM from training or its dev eval (`evaluated`)."""
    from r3rag.util.jsonl import read_jsonl

    metrics = rl_dir / "metrics.jsonl"
    rows = read_jsonl(metrics, allow_empty=True) if metrics.is_file() else []
    kept = (manifest.get("metrics") or {}).get("kept_step")
    points = []
    for r in rows:
        if upto is not None and r["step"] > upto:
            continue
        point = {"step": r["step"], "reward": r.get("reward")}
        if "dev/em" in r:
            point["dev_em"] = r["dev/em"]
        elif r["step"] == kept and evaluated is not None:  # the published policy, scored by the eval stage
            point["dev_em"] = evaluated
        points.append(point)
    return points


def _dev_eval_ems(runs_dir: Path) -> dict[str, float]:
    """{rl artifact id: EM of its policy on the dev split}, by the eval artifact that scored it on
    the most dev questions; read once for a whole chain."""
    from r3rag.core.artifacts import list_artifacts

    best: dict[str, tuple[int, float]] = {}
    for ev in list_artifacts(runs_dir, "eval"):
        rl_id = ((ev.manifest.get("inputs") or {}).get("rl") or {}).get("id")
        scored = ev.path / "metrics.json"
        if not rl_id or (ev.manifest.get("config") or {}).get("split") != "dev" or not scored.is_file():
            continue
        rl = json.loads(scored.read_text()).get("systems", {}).get("rl")
        if rl and (rl_id not in best or rl.get("n", 0) > best[rl_id][0]):
            best[rl_id] = (rl.get("n", 0), rl["em"])
    return {rl_id: em for rl_id, (_, em) in best.items()}
