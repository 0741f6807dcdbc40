"""Synthesis throughput against a chat endpoint: concurrency 1 vs 32 in flight.

A loopback OpenAI-compatible server (tests/chat_server.py) answers every request after a fixed
delay (default 200 ms), as a scripted teacher that follows the gold chain of synthetic-world
questions. The R3-RAG attempt loop (`stages.synthesize.attempt_loop`: rollouts through real
BM25, verification) runs with the `openai` teacher at concurrency 1 and at concurrency 32; the
ratio of questions per second shows that requests really are in flight together (ideal: 32x,
less the turns where fewer than 32 questions are still searching).

Usage:
    python benchmarks/synthesis.py [--delay 0.2] [--n-sequential 12] [--n-concurrent 256]
Last line: {"concurrency_speedup": ..., "sequential_qps": ..., "concurrent_qps": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the loopback server

from r3rag.core.protocol import Protocol  # noqa: E402
from r3rag.data.world import WorldConfig, generate_world  # noqa: E402
from r3rag.generation.openai_client import ChatClient  # noqa: E402
from r3rag.retrieval.bm25 import BM25Retriever  # noqa: E402
from r3rag.stages.synthesize import Config, attempt_loop  # noqa: E402
from r3rag.synthesis.teachers import endpoint_teacher  # noqa: E402
from tests.chat_server import ChatServer  # noqa: E402
from tests.world_teacher import WorldTeacher  # noqa: E402


def measure(url: str, questions: list[dict], retriever, protocol: Protocol, concurrency: int) -> dict:
    cfg = Config(attempts=1, batch_size=len(questions), concurrency=concurrency)
    with ChatClient(url, "teacher", concurrency=concurrency, timeout=30) as client:
        teacher = endpoint_teacher(client, protocol)
        t0 = time.perf_counter()
        rows = list(attempt_loop(questions, teacher, retriever, protocol, cfg))
        secs = time.perf_counter() - t0
        requests = client.stats.requests
    accepted = sum(r["status"] == "accepted" for r in rows)
    return {
        "questions": len(rows),
        "accepted": accepted,
        "requests": requests,
        "seconds": round(secs, 2),
        "qps": round(len(rows) / secs, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=0.2, help="seconds the endpoint takes per request")
    ap.add_argument("--n-sequential", type=int, default=12)
    ap.add_argument("--n-concurrent", type=int, default=256)
    ap.add_argument("--protocol", default="search-r1")
    args = ap.parse_args()
    world = generate_world(WorldConfig(seed=0))
    questions = world.train[: max(args.n_sequential, args.n_concurrent)]
    retriever = BM25Retriever.build(world.docs)
    protocol = Protocol(name=args.protocol, template="minimal", doc_style="plain")
    with ChatServer(reply=WorldTeacher(questions, protocol=args.protocol), delay=args.delay) as srv:
        seq = measure(srv.url, questions[: args.n_sequential], retriever, protocol, concurrency=1)
        con = measure(srv.url, questions[: args.n_concurrent], retriever, protocol, concurrency=32)
    print(f"concurrency  1: {seq}", file=sys.stderr)
    print(f"concurrency 32: {con}", file=sys.stderr)
    print(
        json.dumps(
            {
                "concurrency_speedup": round(con["qps"] / seq["qps"], 2),
                "sequential_qps": seq["qps"],
                "concurrent_qps": con["qps"],
                "delay_s": args.delay,
                "requests_per_question": round(con["requests"] / con["questions"], 2),
                "accepted": [seq["accepted"], con["accepted"]],
                "n": [seq["questions"], con["questions"]],
            }
        )
    )


if __name__ == "__main__":
    main()
