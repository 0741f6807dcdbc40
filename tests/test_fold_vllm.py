"""RL on folded trajectories with vLLM rollouts (`rl.context=fold`, `rl.vllm=colocate|server`),
without an engine: `expand` rebuilds every per-token key TRL puts in its batch with vLLM (the
sampling log-probs, the importance-sampling ratio in each of TRL's modes) per row, by hand-checked
values; the env loop hands vLLM each turn's folded context and keeps its log-probs per turn; and a
GRPO (and PPO) step through TRL's own loss with its vLLM correction on runs on the rows. The same
with a real engine: tests/test_vllm_real.py (the vllm tier)."""

import collections
import math
from types import SimpleNamespace

import pytest
import torch

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.rl.fold_rows import SAMPLING_METRICS, expand, turn_rows
from tests.test_long_horizon import P, _long, _one_step, _run, _scripted_step, _tokenizer, retriever, world  # noqa: F401 (fixtures)

# ---- expand, by hand ----------------------------------------------------------------------------

# Two trajectories: the first two model turns (the second ends with the EOS the env appended,
# unsampled: mask 0, no log-prob), the second one turn. Token t's log-prob under the fake policy
# is -0.5 - 0.1 t (`Scoring`), so each ratio below is a sum of a few tenths.
ROWS = [
    [
        {"prompt_ids": [5, 6], "completion_ids": [3, 4], "env_mask": [1, 1], "logprobs": [-0.9, None]},
        {
            "prompt_ids": [5, 6, 3, 4, 7],
            "completion_ids": [2, 8, 1],
            "env_mask": [1, 1, 0],
            "logprobs": [-0.6, -1.2, None],
        },
    ],
    [{"prompt_ids": [5, 9], "completion_ids": [4], "env_mask": [1], "logprobs": [-0.2]}],
]
FLAT = [r for rs in ROWS for r in rs]


def _old(token: int) -> float:
    return -0.5 - 0.1 * token


class Scoring:
    """The trainer's side `expand` uses: a policy whose log-prob of token t is -0.5 - 0.1 t
    (padding included, as a real forward pass gives values there too), TRL's vLLM settings."""

    def __init__(self, mode="sequence_mask", low=0.5, high=1.1, chunks=2):
        self.args = SimpleNamespace(steps_per_generation=chunks)
        self._tokenizer = SimpleNamespace(pad_token_id=0)
        self.accelerator = SimpleNamespace(gather=lambda t: t)  # one process
        self.model, self.ref_model = "policy", None
        self.vllm_importance_sampling_mode = mode
        self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max = low, high
        self._metrics = {"train": collections.defaultdict(list)}

    def _get_per_token_logps_and_entropies(self, model, ids, attention, width):
        return -0.5 - 0.1 * ids[:, -width:].float(), None, None


def _trl_out(ratio_width: int = 1, vllm: bool = True) -> dict:
    """TRL's batch with vLLM as it reaches `expand`: one row per trajectory (its last turn), every
    per-token key of that shape (values that must not survive: 99)."""
    out = {
        "prompt_ids": torch.tensor([[5, 6, 3, 4, 7], [0, 0, 0, 5, 9]]),
        "prompt_mask": torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]),
        "completion_ids": torch.tensor([[2, 8, 1], [4, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "tool_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
        "advantages": torch.tensor([1.0, -1.0]),
        "num_items_in_batch": torch.tensor(3),
        "sampling_per_token_logps": torch.full((2, 3), 99.0),
    }
    if vllm:
        out["old_per_token_logps"] = torch.full((2, 3), 99.0)
        out["importance_sampling_ratio"] = torch.full((2, ratio_width), 99.0)
    return out


def _by_hand(row: dict, mode: str, low: float | None, high: float | None) -> list[float]:
    """TRL's ratio for one row, in plain Python: exp(old - sampling) on the trained tokens that have
    a sampling log-prob (the others: a difference of 0), per token or summed, truncated or masked."""
    diffs = [
        (_old(t) - lp) if m and lp is not None else 0.0
        for t, m, lp in zip(row["completion_ids"], row["env_mask"], row["logprobs"])
    ]
    ratios = [math.exp(sum(diffs))] if mode.startswith("sequence") else [math.exp(d) for d in diffs]
    lo, hi = -math.inf if low is None else low, math.inf if high is None else high
    if mode.endswith("truncate"):
        return [min(max(r, lo), hi) for r in ratios]
    return [r if lo <= r <= hi else 0.0 for r in ratios]


@pytest.mark.parametrize("mode", ["sequence_mask", "sequence_truncate", "token_mask", "token_truncate"])
def test_expand_rebuilds_trls_vllm_keys_per_row_as_trl_computes_them(mode):
    trainer = Scoring(mode, low=0.5, high=1.1)
    new = expand(trainer, _trl_out(1 if mode.startswith("sequence") else 3), ROWS)
    assert new["completion_ids"].shape == (4, 3)  # 3 rows, then a padding row: whole mini-batches of 2
    for key in ("old_per_token_logps", "sampling_per_token_logps", "tool_mask", "completion_mask"):
        assert new[key].shape == new["completion_ids"].shape, key
    sampling = new["sampling_per_token_logps"]
    for r, row in enumerate(FLAT):  # each row's own sampling log-probs: None as NaN, 0.0 past its end
        lps = [math.nan if x is None else x for x in row["logprobs"]]
        expected = torch.tensor(lps + [0.0] * (3 - len(lps)))
        assert torch.allclose(sampling[r], expected, equal_nan=True), r
    assert torch.equal(sampling[3], torch.zeros(3))
    ratio = new["importance_sampling_ratio"]
    assert ratio.shape == ((4, 1) if mode.startswith("sequence") else (4, 3))
    for r, row in enumerate(FLAT):
        got = ratio[r, : len(row["completion_ids"])] if ratio.size(1) > 1 else ratio[r]
        assert torch.allclose(got, torch.tensor(_by_hand(row, mode, 0.5, 1.1)), atol=1e-6), (r, got)
    # the cases the bounds decide: the first row's e^0.1 is over 1.1, the last row's e^-0.7 under 0.5
    first, last = (ratio[0, 0].item(), ratio[2, 0].item())
    assert (first, last) == pytest.approx((0.0, 0.0) if mode.endswith("mask") else (1.1, 0.5))


@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])
def test_padding_rows_contribute_nothing_and_nothing_is_nan(mode):
    trainer = Scoring(mode, low=None, high=3.0, chunks=4)  # 3 rows, one padding row
    new = expand(trainer, _trl_out(1 if mode.startswith("sequence") else 3), ROWS)
    pad = new["row_of"] < 0
    assert pad.tolist() == [False, False, False, True]
    assert new["advantages"][pad].abs().sum() == 0
    mask = new["completion_mask"] * new["tool_mask"]
    assert mask[pad].sum() == 0 and new["num_items_in_batch"] == mask.sum() == 5
    ratio = new["importance_sampling_ratio"]
    assert torch.isfinite(ratio).all()  # a NaN there would poison TRL's loss even where masked (NaN x 0)
    assert (ratio[pad] == 1.0).all()  # no difference on a row with no tokens
    # TRL's GRPO loss term for each row, its per-row ratio applied: the padding row's is exactly 0
    advantages = new["advantages"].unsqueeze(1)
    per_row = (-(advantages * ratio) * mask).sum(1)
    assert per_row[pad].tolist() == [0.0] and per_row[~pad].abs().sum() > 0


def test_without_the_vllm_correction_only_the_sampling_logprobs_are_rebuilt():
    """transformers' rollouts, or vLLM's at mixed temperatures (TRL's correction off): TRL still
    batches the sampling log-probs (its off-policy mask reads them): per row too, no ratio."""
    new = expand(Scoring(), _trl_out(vllm=False), ROWS)
    assert new["sampling_per_token_logps"].shape == (4, 3) and new["sampling_per_token_logps"][2, 0] == -0.2
    assert "importance_sampling_ratio" not in new and "old_per_token_logps" not in new


def test_the_logged_sampling_lines_describe_every_row():
    trainer = Scoring("sequence_mask", low=0.5, high=1.1)
    for key in SAMPLING_METRICS:  # what TRL logged on the last turns it saw
        trainer._metrics["train"][key].append(-1.0)
    expand(trainer, _trl_out(), ROWS)
    logged = {
        k.rsplit("/", 2)[-2][:5] + "/" + k.rsplit("/", 1)[-1]: v[-1] for k, v in trainer._metrics["train"].items()
    }
    assert all(len(v) == 1 for v in trainer._metrics["train"].values())  # in place of TRL's, not beside them
    # |old - sampling| on trained tokens with a log-prob: 0.1 (row 1), 0.1 and 0.1 (row 2), 0.7 (row 3)
    assert logged["sampl/mean"] == pytest.approx(0.25) and logged["sampl/max"] == pytest.approx(0.7)
    # per-row ratios e^0.1 (over 1.1: masked to 0), e^-0.2, e^-0.7 (under 0.5: 0); the padding row left out
    ratios = [0.0, math.exp(-0.2), 0.0]
    assert logged["impor/min"] == 0.0 and logged["impor/max"] == pytest.approx(ratios[1])
    assert logged["impor/mean"] == pytest.approx(sum(ratios) / 3)


def test_fold_with_vllm_is_no_longer_refused():
    from r3rag.stages.rl import Config, validate

    for vllm in ("colocate", "server", "auto", ""):
        validate(Config(context="fold", vllm=vllm))


# ---- the env loop through vLLM (a scripted server: no engine) -----------------------------------


class ScriptedServer:
    """TRL's vLLM client as `VLLMGenerator` calls it in server mode: every row searches; each
    token's log-prob tells the call and position it came from. Keeps the prompts it was sent."""

    def __init__(self, tok):
        self.ids = tok.encode(" <search> founded </search>", add_special_tokens=False)
        self.prompts: list[list[list[int]]] = []
        self.logprobs: list[list[float]] = []

    def generate(self, prompts, n, temperature, top_p, max_tokens, logprobs, generation_kwargs):
        call = len(self.prompts)
        self.prompts.append([list(p) for p in prompts])
        lps = [-(call + 1) / 10 - j / 100 for j in range(len(self.ids))]
        self.logprobs.append(lps)
        return {"completion_ids": [list(self.ids)] * len(prompts), "logprobs": [[[x] for x in lps]] * len(prompts)}


def test_vllm_rollouts_sample_each_turn_from_its_folded_context_and_keep_its_logprobs(world, retriever):
    from r3rag.generation.vllm import VLLMGenerator

    tok = _tokenizer(world)
    server = ScriptedServer(tok)
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(mode="server", vllm_client=server), processing_class=tok)
    cfg = EnvConfig(top_k=2, max_turns=3, max_new_tokens=16, context="fold")
    trajs = run_rollouts(_long(world.test, 3)[:2], VLLMGenerator(trainer), retriever, P, cfg, tok)
    assert len(server.prompts) == 3
    for i, traj in enumerate(trajs):
        rows = turn_rows(traj, tok.eos_token_id)
        assert len(rows) == 3
        for k, row in enumerate(rows):
            assert row["prompt_ids"] == server.prompts[k][i]  # the row trains on the context vLLM sampled from
            n = len(server.ids)
            assert row["completion_ids"][:n] == server.ids and row["logprobs"][:n] == server.logprobs[k]
        traj.fold = False  # the same turns, every document kept: the third turn's context was folded
        assert len(rows[2]["prompt_ids"]) < len(traj.context_ids(upto=len(traj.turns) - 1))


# ---- a step through TRL's loss with its vLLM correction ------------------------------------


def _policy_logprobs(model, traj, eos_id: int, shift: dict[int, float]) -> None:
    """Each model turn's log-probs as vLLM would report them for these weights: the policy's own
    under the turn's folded context (turn k's moved by `shift[k]` per token: a rollout policy
    that parts from the trainer's there)."""
    turns = [t for t in traj.turns if t.role == "model"]
    for k, (turn, row) in enumerate(zip(turns, turn_rows(traj, eos_id))):
        n = len(turn.ids)
        ids = torch.tensor([row["prompt_ids"] + turn.ids])
        with torch.no_grad():
            logits = model(ids).logits[0, -n - 1 : -1].float()
        lps = logits.log_softmax(-1).gather(1, ids[0, -n:].unsqueeze(1)).squeeze(1)
        turn.logprobs = (lps + shift.get(k, 0.0)).tolist()


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_folded_step_with_vllms_correction_weighs_each_row_by_its_own_ratio(world, retriever, tmp_path, algorithm):
    """TRL's vLLM path on (use_vllm, its correction: sequence_mask, bounds (None, 3)) with the
    rollouts scripted: every row's ratio is its own turn's (1 where the rollout policy is the
    trainer's, exp(-0.05 n) on the turn that parts from it: not the last, which TRL alone saw),
    TRL's loss runs on the rows (GRPO's, and PPO's on the same batch), and the logged difference is
    that turn's."""
    from r3rag.rl.grpo import build_trainer, rollout_batch
    from r3rag.rl.rewards import RewardScorer, RewardSettings
    from r3rag.training.modeling import tiny_model

    q = _long(world.test, 4, "mentor_chain")[0]
    tok = _tokenizer(world)
    right, _ = _run(world, retriever, [q], context="fold")
    wrong, _ = _run(world, retriever, [{**q, "golden_answers": ["nowhere"]}], context="fold")
    pair = [right[0], wrong[0]]
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64, max_positions=4096)
    _policy_logprobs(model, pair[0], tok.eos_token_id, {1: 0.05})
    _policy_logprobs(model, pair[1], tok.eos_token_id, {})
    batch = rollout_batch(pair, tok.eos_token_id, 100_000, fold=True)
    scorer = RewardScorer({"em": 1.0}, RewardSettings(), P)
    trainer = build_trainer(
        model, tok, [q], None, P, scorer, _one_step(lr=1e-2, context="fold", algorithm=algorithm), tmp_path
    )
    # TRL's vLLM path without an engine: the rollouts are scripted, the weight sync a no-op
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    trainer.vllm_generation, trainer._last_loaded_step = SimpleNamespace(sync_weights=lambda: None), -1

    before = [p.detach().clone() for p in model.parameters()]
    inputs = _scripted_step(trainer, batch, scorer.score(pair, [q, q]))
    rows = inputs["completion_ids"].shape[0]
    assert rows == 10 and inputs["importance_sampling_ratio"].shape == (rows, 1)
    assert inputs["sampling_per_token_logps"].shape == inputs["completion_ids"].shape
    parted = [t for t in pair[0].turns if t.role == "model"][1]
    ratios = inputs["importance_sampling_ratio"][:, 0].tolist()
    for (traj, k), value in zip(_row_keys(inputs, pair, tok.eos_token_id), ratios):
        expected = math.exp(-0.05 * len(parted.ids)) if (traj, k) == (0, 1) else 1.0
        assert value == pytest.approx(expected, abs=1e-4), (traj, k)
    logged = trainer.state.log_history[0]
    assert logged["sampling/sampling_logp_difference/max"] == pytest.approx(0.05, abs=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _row_keys(inputs, trajs, eos_id: int) -> list[tuple[int, int]]:
    """(trajectory, turn) of each row of TRL's shuffled batch: its trajectory from `row_of`, its
    turn by its prompt (left-padded) among that trajectory's rows."""
    keys = []
    for ids, mask, traj in zip(
        inputs["prompt_ids"].tolist(), inputs["prompt_mask"].tolist(), inputs["row_of"].tolist()
    ):
        prompt = [i for i, m in zip(ids, mask) if m]
        turns = [row["prompt_ids"] for row in turn_rows(trajs[traj], eos_id)]
        keys.append((traj, turns.index(prompt)))
    return keys
