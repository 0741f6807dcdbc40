"""Teachers that write trajectories for the cold start.

`oracle`: follows each question's gold hop chain (`metadata.chain`: query, fact, value per
hop) through the REAL retriever. It writes the queries; whether the retriever finds the
needed document is checked afterwards, so its acceptance rate measures retrieval too.

Usage:
    gen = oracle_generator(questions, protocol)
    trajs = run_rollouts(questions, gen, retriever, protocol, env_cfg)
    ok, reason = verify_oracle(traj, question)
"""

from __future__ import annotations

from r3rag.env import Trajectory
from r3rag.errors import UserError
from r3rag.generation.scripted import ScriptedGenerator
from r3rag.metrics import exact_match
from r3rag.protocol import Protocol


def oracle_generator(questions: list[dict], protocol: Protocol, tokenizer=None) -> ScriptedGenerator:
    chains = {}
    for q in questions:
        chain = q.get("metadata", {}).get("chain")
        if not chain:
            raise UserError(f"question {q.get('id')!r}: the oracle teacher needs metadata.chain (gold hops)")
        chains[str(q["id"])] = (chain, q["golden_answers"][0])

    def script(traj: Trajectory) -> str:
        chain, answer = chains[traj.id]
        hop = traj.model_turn_count()
        # Restate the fact the previous search found, then take the next hop (or answer).
        thought = chain[hop - 1]["fact"] if hop > 0 else None
        if hop < len(chain):
            return protocol.search_turn(chain[hop]["query"], thought)
        return protocol.answer_turn(answer, thought)

    return ScriptedGenerator(script, tokenizer)


def verify_oracle(traj: Trajectory, question: dict) -> tuple[bool, str]:
    """Accept only a well-formed, correct chain whose every search retrieved the doc it needed."""
    if traj.finish_reason != "answer":
        return False, f"finish:{traj.finish_reason}"
    for hop, (step_docs, link) in enumerate(zip(traj.retrieved, question["metadata"]["chain"])):
        if link["doc_id"] not in step_docs:
            return False, f"retrieval_miss:hop{hop + 1}"
    if not exact_match(traj.answer, question["golden_answers"]):
        return False, "wrong_answer"
    return True, "ok"
