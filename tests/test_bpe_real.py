"""The token-level rules, on a real byte-level BPE tokenizer and model (SmolLM2-135M-Instruct):
the ids trained on are the ids sampled, stops work when BPE merges a closing tag with the next
character, env_mask covers exactly the documents, EOS gets gradient only where it was sampled,
and the chat framing is the same in synthesis, SFT, RL and eval.

The model writes what a logits processor forces (every other logit -inf), so a turn takes a
few tokens; its forward passes, sampling, stopping and KV-cache reuse are the real ones.
Skips with one line without the `[real]` extra (see the `smollm2` fixture)."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor

from r3rag.core.env import EnvConfig, Trajectory, Turn, new_trajectory, run_rollouts
from r3rag.core.protocol import Protocol
from r3rag.generation.hf import HFGenerator
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.retrieval.bm25 import BM25Retriever
from r3rag.rl.grpo import rollout_batch
from r3rag.training.helpers import IGNORE, completion_with_eos, tokenize_trajectory

P = Protocol(template="search-r1", doc_style="search-r1", chat=True)
DOCS = [
    {"id": "d1", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "d2", "title": "Rome", "text": "Rome is the capital of Italy."},
    {"id": "d3", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"id": "d4", "title": "Madrid", "text": "Madrid is the capital of Spain."},
]
QUESTIONS = [
    {"id": "q1", "question": "What is the capital of France?", "golden_answers": ["Paris"]},
    {"id": "q2", "question": "What is the capital of Italy?", "golden_answers": ["Rome"]},
]
DOC_MARK = "Doc 1(Title:"  # only the environment's documents contain it (the instruction does not)


class Forced(LogitsProcessor):
    """Each row writes `script(context_text)` token by token: every other logit is -inf, so
    greedy and sampling both pick it. A new generate call (the ids do not continue the previous
    step's) picks new scripts; a finished script repeats its last token (the row is stopped)."""

    def __init__(self, tok, script):
        self.tok, self.script, self.prev = tok, script, None
        self.written: list[list[int]] = []  # per call: what each row was made to write

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        prev, self.prev = self.prev, input_ids
        if not (
            prev is not None
            and input_ids.shape == (prev.shape[0], prev.shape[1] + 1)
            and torch.equal(input_ids[:, :-1], prev)
        ):
            self.start = input_ids.shape[1]
            scripts = [self.script(self.tok.decode(row, skip_special_tokens=True)) for row in input_ids.tolist()]
            width = max(map(len, scripts))
            self.scripts = torch.tensor([s + s[-1:] * (width - len(s)) for s in scripts], device=scores.device)
        forced = self.scripts[:, min(input_ids.shape[1] - self.start, self.scripts.shape[1] - 1)]
        return torch.full_like(scores, float("-inf")).scatter_(1, forced[:, None], 0.0)


class Recording:
    """A generator that remembers what the inner one returned, per trajectory (by identity)."""

    def __init__(self, inner):
        self.inner, self.returned = inner, {}

    def generate(self, contexts, stop, max_new_tokens):
        outs = self.inner.generate(contexts, stop, max_new_tokens)
        for c, o in zip(contexts, outs):
            self.returned.setdefault(id(c), []).append(list(o.ids))
        return outs


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def chat_prompt_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": P.prompt(question)}], tokenize=False, add_generation_prompt=True
    )
    return enc(tok, text)


def rollouts(model, tok, script, questions=QUESTIONS, protocol=P, temperature=0.0, max_turns=2):
    gen = Recording(
        HFGenerator(model, tok, batch_size=4, temperature=temperature, logits_processors=[Forced(tok, script)])
    )
    trajs = run_rollouts(
        questions,
        gen,
        BM25Retriever.build(DOCS),
        protocol,
        EnvConfig(top_k=2, max_turns=max_turns, max_new_tokens=12),
        tok,
    )
    return trajs, gen


@pytest.fixture(scope="module")
def searched(smollm2):
    """Two questions, each: a search written in a NON-canonical BPE split (" Par" + "is", which
    re-encodes as the one token " Paris"), the documents, then an answer. Sampled (T = 1)."""
    model, tok = smollm2
    search = enc(tok, " <search>") + enc(tok, " Par") + enc(tok, "is") + enc(tok, " </search>")
    answer = enc(tok, " <answer> x </answer>")
    torch.manual_seed(0)
    trajs, gen = rollouts(model, tok, lambda ctx: answer if DOC_MARK in ctx else search, temperature=1.0)
    return tok, trajs, gen, search, answer


@pytest.fixture(scope="module")
def stopped(smollm2):
    """q1: `<answer> Paris </answer>.` (BPE merges '>' with '.') followed by more forced text;
    q2: ` Rome` and then the model samples `<|im_end|>`."""
    model, tok = smollm2
    merged, after = enc(tok, " <answer> Paris </answer>."), enc(tok, " And more")
    rome_eos = enc(tok, " Rome") + [tok.eos_token_id] + enc(tok, " junk")
    trajs, _ = rollouts(model, tok, lambda ctx: rome_eos if "Italy" in ctx else merged + after, max_turns=1)
    return tok, trajs, merged


def test_ids_trained_on_are_exactly_the_ids_sampled(searched):
    tok, trajs, gen, search, answer = searched
    assert enc(tok, tok.decode(search)) != search  # decode + re-encode would change these ids
    batch = rollout_batch(trajs, tok.eos_token_id, 512)
    for i, (t, q) in enumerate(zip(trajs, QUESTIONS)):
        assert t.finish_reason == "answer" and t.queries == ["Paris"] and t.answer == "x"
        returned = gen.returned[id(t)]
        assert returned == [search, answer]  # the generator returned what the model sampled
        ids, mask = batch["completion_ids"][i], batch["env_mask"][i]
        model_ids = [x for x, m in zip(ids[:-1], mask[:-1]) if m == 1]
        assert model_ids == search + answer  # == the concatenation, no decode/re-encode
        assert batch["prompt_ids"][i] == enc(tok, P.context_prompt(q["question"], tok))
        assert ids[-1] == tok.eos_token_id and mask[-1] == 0  # appended for TRL, never sampled


def test_stop_at_a_closing_tag_merged_with_the_next_character(stopped):
    tok, trajs, merged = stopped
    t = trajs[0]
    assert tok.convert_ids_to_tokens(merged[-3:]) == ["Ġ</", "answer", ">."]
    (turn,) = [x for x in t.turns if x.role == "model"]
    assert turn.ids == merged and tok.convert_ids_to_tokens(turn.ids[-1]) == ">."  # stopped there, nothing after
    assert turn.text.endswith("</answer>.") and "And" not in turn.text
    assert t.steps[0]["kind"] == "answer" and t.answer == "Paris" and t.finish_reason == "answer"
    assert rollout_batch([t], tok.eos_token_id, 512)["completion_ids"][0] == merged + [tok.eos_token_id]


def test_env_mask_covers_exactly_the_inserted_documents(searched):
    tok, trajs, _, _, _ = searched
    batch = rollout_batch(trajs, tok.eos_token_id, 512)
    for t, ids, mask in zip(trajs, batch["completion_ids"], batch["env_mask"]):
        assert [x.role for x in t.turns] == ["model", "env", "model"]
        offset, zeros = 0, set()
        for turn in t.turns:
            n = len(turn.ids)
            if turn.role == "env":
                assert turn.text.startswith("\n<information> Doc 1(Title:")
                assert turn.ids == enc(tok, turn.text) and n == len(enc(tok, turn.text))
                assert mask[offset : offset + n] == [0] * n and ids[offset : offset + n] == turn.ids
                zeros |= set(range(offset, offset + n))
            else:
                assert mask[offset : offset + n] == [1] * n
            offset += n
        assert offset == len(ids) - 1  # then the final EOS
        assert {j for j, m in enumerate(mask) if m == 0} == zeros | {offset}  # that EOS was not sampled
        assert len(zeros) > 20


def test_eos_after_a_stop_at_answer_is_masked(stopped):
    tok, trajs, _ = stopped
    t = trajs[0]
    assert t.finish_reason == "answer" and not t.eos_sampled
    batch = rollout_batch([t], tok.eos_token_id, 512)
    ids, mask = batch["completion_ids"][0], batch["env_mask"][0]
    assert ids[-1] == tok.eos_token_id and mask[-1] == 0 and ids.count(tok.eos_token_id) == 1
    assert set(mask[:-1]) == {1}


def test_a_sampled_eos_is_kept_and_learned_exactly_once(stopped, smollm2):
    tok, trajs, _ = stopped
    eos = tok.eos_token_id
    t = trajs[1]  # " Rome" then <|im_end|>: no answer tag, the message is over
    (turn,) = [x for x in t.turns if x.role == "model"]
    assert turn.ids == enc(tok, " Rome") + [eos] and turn.text == " Rome"  # kept in ids, not in text
    assert t.eos_sampled and t.finish_reason == "invalid"
    batch = rollout_batch([t], eos, 512)
    ids, mask = batch["completion_ids"][0], batch["env_mask"][0]
    assert ids == enc(tok, " Rome") + [eos] and mask == [1, 1]  # one EOS, learned, last
    # The r3rag step format ends an answer with EOS itself: answer + sampled EOS, learned once.
    model, _ = smollm2
    r3 = Protocol(name="r3rag", chat=True)
    step = enc(tok, "Step 1:\nThe final answer: Paris") + [eos]
    (t3,), _ = rollouts(model, tok, lambda ctx: step, questions=QUESTIONS[:1], protocol=r3, max_turns=3)
    assert t3.finish_reason == "answer" and t3.answer == "Paris" and t3.eos_sampled
    b3 = rollout_batch([t3], eos, 512)
    assert b3["completion_ids"][0] == step and b3["env_mask"][0] == [1] * len(step)
    assert b3["completion_ids"][0].count(eos) == 1
    # A generator that drops the sampled EOS from its ids (vLLM's adapter): appended, learned.
    dropped = Trajectory(
        "q", "?", "", turns=[Turn("model", " Rome", enc(tok, " Rome"))], eos_sampled=True, finish_reason="invalid"
    )
    assert completion_with_eos(dropped, eos, eos_rule="sampled") == (enc(tok, " Rome") + [eos], [1, 1])


def test_sft_learns_the_eos_closing_the_answer(stopped):
    from r3rag.training.helpers import tokenize_rows

    tok, trajs, _ = stopped
    ids, labels = tokenize_trajectory(trajs[0].to_json(), tok, protocol=P)
    assert ids[-1] == tok.eos_token_id and labels[-1] == tok.eos_token_id
    assert ids[-8:-1] == enc(tok, " <answer> Paris </answer>.") == labels[-8:-1]
    # sft's batched encoding (the Rust tokenizer's batch path) gives the same BPE ids, chat template included
    rows = [t.to_json() for t in trajs]
    assert tokenize_rows(rows, tok, 0, P, "trajectory") == [tokenize_trajectory(r, tok, protocol=P) for r in rows]


def test_chat_framing_is_the_same_in_synthesis_sft_rl_and_eval(smollm2, smollm2_runs, monkeypatch):
    from r3rag.evaluation.systems import SystemSpec, load_system
    from r3rag.rl import grpo
    from r3rag.rl.rewards import RewardScorer, RewardSettings
    from r3rag.stages.rl import Config

    _, tok = smollm2
    q = QUESTIONS[0]
    expected = chat_prompt_ids(tok, q["question"])
    text = tok.decode(expected)
    for marker in ("<|im_start|>system", "<|im_start|>user", "<|im_start|>assistant"):
        assert text.count(marker) == 1, marker
    assert text.endswith("<|im_start|>assistant\n") and P.prompt(q["question"]) in text
    answer = "<answer> Paris </answer>"
    # synthesis (the oracle teacher stores the plain prompt) -> SFT frames it for this tokenizer
    row = {
        **q,
        "prompt": P.prompt(q["question"]),
        "turns": [{"role": "model", "text": answer}],
        "finish_reason": "answer",
        "answer": "Paris",
    }
    ids, labels = tokenize_trajectory(row, tok, protocol=P)
    assert ids[: len(expected)] == expected and set(labels[: len(expected)]) == {IGNORE}
    assert ids[len(expected) :] == enc(tok, answer) + [tok.eos_token_id]
    # a trajectory synthesised with this tokenizer (an hf teacher) starts from the same ids
    assert new_trajectory(q, P, tok).prompt_ids == expected
    # RL: the prompt TRL hands the rollout_func, and the prompt ids it gets back
    scripted = ScriptedGenerator(lambda t: answer, tok)

    class FakeBackend:
        def __init__(self, *a):
            pass

        def __enter__(self):
            return scripted

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(grpo, "generator", FakeBackend)
    scorer = RewardScorer({"em": 1.0}, RewardSettings(), P)
    rollout = grpo.make_rollout_func([q], None, P, tok, scorer, Config(max_turns=1))
    batch = rollout([P.context_prompt(q["question"], tok)], None)
    assert batch["prompt_ids"] == [expected]
    assert tok.encode(P.context_prompt(q["question"], tok), add_special_tokens=False) == expected
    # eval: a transformers model system (chat by default) frames the same way
    _, ref = smollm2_runs
    system = load_system("smol", SystemSpec(model=str(ref.path / "model"), dtype="float32"), None, 4)
    (t,) = run_rollouts([q], scripted, None, system.protocol, EnvConfig(max_turns=1), system.tokenizer)
    assert system.protocol == P and t.prompt_ids == expected


def test_chat_without_a_chat_template_is_one_clear_error(smollm2):
    from r3rag.training.helpers import require_chat_template
    from r3rag.training.modeling import train_word_tokenizer
    from r3rag.util.errors import UserError

    _, tok = smollm2
    require_chat_template(P, tok, "sft")  # has one: fine
    plain = train_word_tokenizer(["What is the capital of France ?"])
    assert not getattr(plain, "chat_template", None)
    with pytest.raises(UserError) as e:
        require_chat_template(P, plain, "sft")
    assert "\n" not in str(e.value) and "chat" in str(e.value)
    require_chat_template(Protocol(chat=False), plain, "sft")  # chat off: no template needed


def test_qa_reader_stops_generating_at_its_answer_s_first_line(smollm2):
    """A closed-book `qa` reader (turn prefilled with `<answer> `) stops at the newline that ends
    the answer's first line, even where BPE merges it with the period; what follows is never generated."""
    model, tok = smollm2
    qa = Protocol(template="qa", chat=True)
    line, rest = enc(tok, " Paris.\n"), enc(tok, "\nThe capital of France is Paris, a city of")
    assert "\n" in tok.convert_ids_to_tokens(line[-1]).replace("Ċ", "\n")  # the newline rides on a merged token
    gen = Recording(HFGenerator(model, tok, batch_size=4, logits_processors=[Forced(tok, lambda ctx: line + rest)]))
    (t,) = run_rollouts(QUESTIONS[:1], gen, None, qa, EnvConfig(mode="direct", max_new_tokens=40), tok)
    assert gen.returned[id(t)] == [line]  # nothing generated past the line
    assert t.answer == "Paris." and t.finish_reason == "answer"
