"""Which tokens get loss: SFT labels and the GRPO env_mask share one span rule."""

import pytest
import torch

from r3rag.core.env import EnvConfig, run_rollouts
from r3rag.core.protocol import Protocol
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.rl.grpo import rollout_batch
from r3rag.training.helpers import IGNORE, tokenize_trajectory
from r3rag.training.modeling import tiny_model, train_word_tokenizer

DOCS = [
    {"id": "p1", "title": "Ava Smith", "text": "Ava Smith works for Zentro Labs ."},
    {"id": "c1", "title": "Zentro Labs", "text": "Zentro Labs is headquartered in Velmar ."},
]
P = Protocol(template="minimal", doc_style="plain")
SCRIPT = [
    "<search> Ava Smith works </search>",
    "<think> Ava Smith works for Zentro Labs . </think> <search> Zentro Labs headquartered </search>",
    "<answer> Velmar </answer>",
]


def _setup():
    tok = train_word_tokenizer([d["text"] for d in DOCS] + ["Question : Where is it ?"])
    gen = ScriptedGenerator(lambda t: SCRIPT[t.model_turn_count()], tok)
    traj = run_rollouts(
        [{"id": "q", "question": "Where is it ?"}], gen, BM25Retriever.build(DOCS), P, EnvConfig(top_k=1), tok
    )[0]
    return tok, traj


def test_sft_labels_equal_grpo_env_mask_on_the_same_trajectory():
    tok, traj = _setup()
    ids, labels = tokenize_trajectory(traj.to_json(), tok)
    batch = rollout_batch([traj], tok.eos_token_id, 512)
    n_prompt = len(traj.prompt_ids)
    assert ids[:n_prompt] == traj.prompt_ids and all(x == IGNORE for x in labels[:n_prompt])
    assert ids[n_prompt:] == batch["completion_ids"][0]
    sft_mask = [int(x != IGNORE) for x in labels[n_prompt:]]
    assert sft_mask[:-1] == batch["env_mask"][0][:-1]  # the same span rule on every turn...
    # ...and the final EOS: learned in SFT after the teacher's answer; in RL only where the model
    # sampled it, and this turn stopped at </answer>.
    assert batch["completion_ids"][0][-1] == tok.eos_token_id and sft_mask[-1] == 1 and batch["env_mask"][0][-1] == 0
    info = tok.convert_tokens_to_ids("<information>")
    assert all(m == 0 for i, m in zip(batch["completion_ids"][0], batch["env_mask"][0]) if i == info)


def test_masked_tokens_get_no_gradient(tmp_path):
    """Through the SFT trainer's own loss: the logits at environment (and prompt) positions
    get exactly zero gradient, those at model positions do not."""
    from datasets import Dataset
    from trl import SFTConfig

    from r3rag.training.trainers import FastSFTTrainer

    tok, traj = _setup()
    ids, labels = tokenize_trajectory(traj.to_json(), tok)
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64)
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], max_length=256)
    trainer = FastSFTTrainer(
        model=model,
        args=args,
        processing_class=tok,
        train_dataset=Dataset.from_dict({"input_ids": [ids], "labels": [labels]}),
    )
    captured = {}

    def keep_logits(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    model.lm_head.register_forward_hook(keep_logits)
    batch = {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        "labels": torch.tensor([labels]),
    }
    trainer.compute_loss(model, batch).backward()
    grad = captured["logits"].grad[0].abs().sum(-1)  # per position; position i predicts token i+1
    targets = torch.tensor(labels[1:] + [IGNORE])
    assert torch.all(grad[targets == IGNORE] == 0)
    assert torch.all(grad[targets != IGNORE] > 0)
    n_env = sum(1 for m in rollout_batch([traj], tok.eos_token_id, 512)["env_mask"][0] if m == 0)
    assert n_env > 10  # the test really covers retrieved tokens


def test_per_step_view_one_sample_per_step_with_loss_on_that_step_only():
    from r3rag.training.helpers import tokenize_steps

    r3 = Protocol(name="r3rag", doc_style="plain")
    script = [
        r3.search_turn("Ava Smith works", step=1),
        r3.search_turn("Zentro Labs headquartered", step=2),
        r3.answer_turn("Velmar", step=3),
    ]
    tok = train_word_tokenizer([d["text"] for d in DOCS] + ["The question : Where is it ?"] + script)
    gen = ScriptedGenerator(lambda t: script[t.model_turn_count()], tok)
    traj = run_rollouts(
        [{"id": "q", "question": "Where is it ?"}], gen, BM25Retriever.build(DOCS), r3, EnvConfig(top_k=1), tok
    )[0]
    assert traj.finish_reason == "answer" and len(traj.retrieved) == 2
    whole, _ = tokenize_trajectory(traj.to_json(), tok)
    samples = tokenize_steps(traj.to_json(), tok)
    assert len(samples) == 3
    model_turns = [t for t in traj.turns if t.role == "model"]
    for k, ((ids, labels), turn) in enumerate(zip(samples, model_turns)):
        target = [x for x in labels if x != IGNORE]
        eos = [tok.eos_token_id] if k == 2 else []
        assert target == turn.ids + eos  # loss on this step only (EOS after the final one)
        assert ids == whole[: len(ids)]  # the prompt is the question, earlier steps and their documents
    docs = tok.encode(traj.turns[1].text, add_special_tokens=False)
    assert samples[1][0][len(samples[1][0]) - len(model_turns[1].ids) - len(docs) :][: len(docs)] == docs
    n = len(model_turns[2].ids) + 1 + 3  # the last step, its EOS and 3 tokens of context
    ids, labels = tokenize_steps(traj.to_json(), tok, max_length=n)[2]
    assert len(ids) == n and ids[3:] == model_turns[2].ids + [tok.eos_token_id] == labels[3:]
    assert ids[:3] == samples[2][0][-n : -n + 3] and labels[:3] == [IGNORE] * 3


def test_only_a_qa_readers_documents_go_back_into_its_prompt():
    """A searching policy's documents stay in their environment turns (the prompt is the question);
    a qa reader's single retrieval is part of its prompt, as eval's rag mode builds it."""
    from r3rag.core.env import Trajectory
    from r3rag.core.protocol import Hit
    from r3rag.training.helpers import framed_prompt

    tok, traj = _setup()
    assert framed_prompt(traj, tok, P) == traj.prompt == P.prompt(traj.question)
    qa = Protocol(template="qa", doc_style="plain")
    hits = [Hit("c1", 1.0, "Zentro Labs", DOCS[1]["text"])]
    reader = run_rollouts(
        [{"id": "r", "question": "Where is it ?"}],
        ScriptedGenerator(lambda t: "Velmar </answer>"),
        BM25Retriever.build(DOCS[1:]),
        qa,
        EnvConfig(mode="rag", top_k=1),
    )[0]
    row = reader.to_json()
    assert framed_prompt(Trajectory.from_json(row), tok, qa) == qa.prompt("Where is it ?", docs=hits) == row["prompt"]
    row["documents"] = []  # closed-book: no retrieval, the bare reader prompt
    assert framed_prompt(Trajectory.from_json(row), tok, qa) == qa.prompt("Where is it ?")


def test_bf16_auto_on_cpu_follows_the_hardware(monkeypatch):
    """auto = bf16 only where the CPU has it natively: emulated bf16 is ~25x slower than fp32."""
    import torch

    from r3rag.training.helpers import device_flags

    # the private torch internals cpu_has_bf16 relies on: a torch without them reads as "no bf16"
    assert callable(torch.cpu._is_avx512_bf16_supported) and callable(torch.cpu._is_amx_tile_supported)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for avx512_bf16, amx, want in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert device_flags("auto") == {"use_cpu": True, "bf16": want}
    assert device_flags(True)["bf16"] is True and device_flags(False)["bf16"] is False


def test_fast_sft_loss_equals_trl_loss_on_a_batch(tmp_path):
    """FastSFTTrainer's plain cross-entropy (small vocabularies) gives TRL's own SFT loss, to
    float precision, on the same padded batch: same value, same tokens counted."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from r3rag.training.trainers import FastSFTTrainer

    tok, traj = _setup()
    ids, labels = tokenize_trajectory(traj.to_json(), tok)
    short = ids[: len(ids) // 2]
    model = tiny_model(tok, layers=1, hidden=32, heads=2, intermediate=64, seed=3)
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], max_length=256)
    data = Dataset.from_dict({"input_ids": [ids, short], "labels": [labels, labels[: len(short)]]})
    pad = len(ids) - len(short)
    batch = {  # the second row right-padded, its padding ignored, as TRL's collator pads
        "input_ids": torch.tensor([ids, short + [tok.pad_token_id] * pad]),
        "attention_mask": torch.tensor([[1] * len(ids), [1] * len(short) + [0] * pad]),
        "labels": torch.tensor([labels, labels[: len(short)] + [IGNORE] * pad]),
    }
    losses = {}
    for name, cls in (("fast", FastSFTTrainer), ("trl", SFTTrainer)):
        trainer = cls(model=model, args=args, processing_class=tok, train_dataset=data)
        with torch.no_grad():
            losses[name] = trainer.compute_loss(model, {k: v.clone() for k, v in batch.items()}).item()
    assert losses["fast"] > 0 and abs(losses["fast"] - losses["trl"]) < 1e-5 * losses["trl"], losses


def _grpo_trainer(tmp_path, **config):
    """(tokenizer, a trajectory's ids, ResumableGRPOTrainer) on a 2-layer tiny model, no rollouts."""
    from datasets import Dataset
    from trl import GRPOConfig

    from r3rag.training.trainers import ResumableGRPOTrainer

    tok, traj = _setup()
    ids, _ = tokenize_trajectory(traj.to_json(), tok)
    model = tiny_model(tok, layers=2, hidden=32, heads=2, intermediate=64, seed=3)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], num_generations=2, **config)
    data = Dataset.from_dict({"prompt": ["Where is it ?"] * 2})
    trainer = ResumableGRPOTrainer(
        model=model, args=args, processing_class=tok, train_dataset=data, reward_funcs=lambda completions, **_: [0.0]
    )
    return tok, ids, trainer


LENGTHS = [24, 20, 24, 15]  # completion lengths of a loss test's 4 rows: the second and fourth right-padded


def _loss_batch(ids, advantages: list[float], seed: int, tool_mask=None) -> dict:
    """A micro-batch as TRL hands `_compute_loss` one: 4 rows of a 12-token prompt and a completion of
    LENGTHS tokens in 24 columns, old and reference log-probs drawn from `seed` (ratios and KL live)."""
    p, k = 12, 24
    completion_mask = torch.tensor([[1] * c + [0] * (k - c) for c in LENGTHS])
    g = torch.Generator().manual_seed(seed)
    batch = {
        "prompt_ids": torch.tensor([ids[:p]] * 4), "prompt_mask": torch.ones(4, p, dtype=torch.long),
        "completion_ids": torch.tensor([ids[p : p + k]] * 4) * completion_mask, "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages),
        "old_per_token_logps": -torch.rand(4, k, generator=g) * 3, "ref_per_token_logps": -torch.rand(4, k, generator=g) * 3,
    }  # fmt: skip
    if tool_mask is not None:
        batch["tool_mask"] = tool_mask
    return batch | {"num_items_in_batch": (completion_mask if tool_mask is None else completion_mask * tool_mask).sum()}


def _projected_rows(monkeypatch) -> list[int]:
    """The number of positions each call of TRL's fused LM head projects, appended as it runs."""
    from trl.trainer import utils as trl_utils

    rows: list[int] = []
    apply = trl_utils._ChunkedLogProbFunction.apply
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", lambda h, *a: rows.append(len(h)) or apply(h, *a))
    return rows


def test_grpo_logps_without_padding_equal_trls_on_the_padded_batch(tmp_path, monkeypatch):
    """ResumableGRPOTrainer scores rows sorted by length, in groups with their all-padding
    columns trimmed: the log-probs, entropies and gradients are TRL's on the whole padded
    batch (prompts left-padded, completions right-padded, as TRL pads them), row by row."""
    from trl import GRPOTrainer

    import r3rag.training.trainers as trainers

    tok, ids, trainer = _grpo_trainer(tmp_path, temperature=0.7, per_device_train_batch_size=2)
    k, pad, n = 30, tok.pad_token_id, len(ids) - 30
    shapes = [(n, k), (n - 6, 8), (n - 2, 20), (n, 3), (n - 9, k), (n - 4, 12)]  # (prompt, completion) lengths
    rows = [[pad] * (n - p) + ids[n - p : n] + ids[n : n + c] + [pad] * (k - c) for p, c in shapes]
    input_ids = torch.tensor(rows)
    mask = torch.tensor([[0] * (n - p) + [1] * (p + c) + [0] * (k - c) for p, c in shapes])
    results = {}
    for name in ("ours", "trl"):
        trainer.model.zero_grad()
        if name == "ours":
            monkeypatch.setattr(trainers, "LOGPS_ROWS", 2)  # three groups of two rows
            call = trainer._get_per_token_logps_and_entropies
        else:
            call = lambda *a, **kw: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **kw)  # noqa: E731
        logps, entropy, _ = call(trainer.model, input_ids, mask, k, batch_size=4, compute_entropy=True)
        (logps * mask[:, -k:]).sum().backward()
        grads = [p.grad.clone() for p in trainer.model.parameters()]
        results[name] = (logps.detach(), entropy.detach(), *grads)
    for ours, theirs in zip(results["ours"], results["trl"], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    assert results["ours"][0][1, 8:].eq(0).all() and results["ours"][0][0].lt(0).all()  # padding scores 0


def test_the_grpo_loss_leaves_retrieved_tokens_out_of_the_lm_head_and_is_trls(tmp_path, monkeypatch):
    """With a retrieved span (tool_mask 0) in each completion, the loss's LM head projects the
    model's own tokens only, and the loss and every gradient are what TRL's loss over all
    completion tokens gives (old and reference log-probs given, so ratios and KL are live)."""
    _, ids, trainer = _grpo_trainer(tmp_path, per_device_train_batch_size=4)
    model = trainer.model
    trainer.beta = 0.1  # the KL term on the given reference log-probs (no reference model built)
    trainer.current_gradient_accumulation_steps = 1  # as Trainer.train sets it
    tool_mask = torch.ones(4, 24, dtype=torch.long)
    tool_mask[:, 6:14] = 0  # the documents of one search
    inputs = _loss_batch(ids, [1.0, -0.5, 0.25, -1.0], 0, tool_mask)
    completion_mask = inputs["completion_mask"]
    scored_rows = _projected_rows(monkeypatch)
    trainer.model.train()
    results = {}
    for skip in (True, False):
        trainer.skip_retrieved = skip
        scored_rows.clear()
        model.zero_grad()
        loss = trainer._compute_loss(trainer.model, {key: v.clone() for key, v in inputs.items()})
        loss.backward()
        results[skip] = (loss.detach(), *[q.grad.clone() for q in model.parameters()])
        own = int((completion_mask * tool_mask).sum()) if skip else int(completion_mask.sum())
        assert sum(scored_rows) == own, (skip, scored_rows)
    assert results[True][0] != 0
    for ours, theirs in zip(results[True], results[False], strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_rows_with_zero_advantage_skip_the_loss_pass_and_the_loss_is_trls(tmp_path, monkeypatch, loss_type):
    """A row whose advantage is 0 (a group whose samples scored alike) is left out of the loss's
    forward and backward; the loss and every gradient are TRL's over every row, for each way TRL
    normalises. A micro-batch of such rows only scores its shortest row (loss 0, no gradient); with a
    KL term every row is scored (its gradient is not 0 there)."""
    _, ids, trainer = _grpo_trainer(tmp_path, per_device_train_batch_size=4, loss_type=loss_type)
    model = trainer.model
    trainer.current_gradient_accumulation_steps = 1
    inputs = _loss_batch(ids, [0.0, -0.5, 0.0, 1.0], 1)
    completion_mask = inputs["completion_mask"]
    scored = _projected_rows(monkeypatch)
    model.train()

    def loss_and_grads(skip: bool, advantages: list[float]):
        trainer.skip_zero_advantage = skip
        scored.clear()
        model.zero_grad()
        batch = {key: v.clone() for key, v in inputs.items()} | {"advantages": torch.tensor(advantages)}
        loss = trainer._compute_loss(model, batch)
        loss.backward()
        return loss.detach(), [q.grad.clone() for q in model.parameters()]

    some = [0.0, -0.5, 0.0, 1.0]
    theirs = loss_and_grads(False, some)
    assert sum(scored) == int(completion_mask.sum())  # every row's tokens projected
    ours = loss_and_grads(True, some)
    assert sum(scored) == 20 + 15 and trainer._metrics["train"]["loss/rows_scored"][-1] == 0.5  # rows 2 and 4
    assert theirs[0] != 0
    for a, b in zip([ours[0], *ours[1]], [theirs[0], *theirs[1]], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    loss, grads = loss_and_grads(True, [0.0] * 4)
    assert sum(scored) == 15 and loss == 0 and all(g.abs().max() == 0 for g in grads)  # the shortest row
    trainer.beta = 0.1  # a KL term: a row with advantage 0 still has a gradient
    loss_and_grads(True, some)
    assert sum(scored) == int(completion_mask.sum())


def test_batched_tokenisation_gives_the_ids_one_encode_per_text_gives():
    """sft encodes every text in one batch call (tokenize_rows); the samples must be exactly what
    tokenize_trajectory / tokenize_steps give row by row, in both views, cut at max_length too."""
    from r3rag.training.helpers import tokenize_rows, tokenize_steps

    tok, traj = _setup()
    other = traj.to_json() | {"id": "q2", "question": "Where is Velmar ?", "prompt": "Question : Where is Velmar ?\n"}
    rows = [traj.to_json(), other, traj.to_json()]  # a repeated text, and one the tokenizer maps to <unk>
    for max_length in (0, 20):
        assert tokenize_rows(rows, tok, max_length, P, "trajectory") == [
            tokenize_trajectory(r, tok, max_length, P) for r in rows
        ]
        assert tokenize_rows(rows, tok, max_length, P, "step") == [
            s for r in rows for s in tokenize_steps(r, tok, max_length, P)
        ]
    assert tokenize_rows(rows, tok, 0, P, "trajectory")[1] != tokenize_rows(rows, tok, 0, P, "trajectory")[0]


def test_trajectory_json_is_asdict_without_ids_key_for_key():
    """Trajectory.to_json builds by hand what asdict gave (minus token ids and logprobs, and the
    context-folding state: the `fold` flag and each documents turn's stub, which the loop renders
    again from `documents`), in the same key order, so trajectories.jsonl files are byte for byte
    what they were."""
    import json
    from dataclasses import asdict

    _, traj = _setup()
    traj.turns[0].logprobs = [-0.5] * len(traj.turns[0].ids)
    expected = asdict(traj)
    expected.pop("prompt_ids"), expected.pop("fold")
    for t in expected["turns"]:
        t.pop("ids"), t.pop("logprobs"), t.pop("stub_ids"), t.pop("stub_text")
    assert json.dumps(traj.to_json()) == json.dumps(expected)
    out = traj.to_json()
    out["steps"][0]["query"] = "changed"
    assert traj.steps[0]["query"] != "changed"  # a copy, not the trajectory's own rows
