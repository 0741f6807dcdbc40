"""Retrieval at Wikipedia scale: what N passages cost to import, index and serve (issue 18).

Builds, in a temp dir it removes at the end, a FlashRAG-style corpus of --passages passages from
the shared pools' real text (data/corpus/*.jsonl, ~13k passages: beyond that they are repeated
with distinct ids, and the script says so), then measures one section at a time. Every phase runs
in its own subprocess, which reports its own peak RSS (getrusage ru_maxrss: it counts the pages
of memory-mapped files it touched, as the kernel does; `*_anon_gb` is the private part alone).

Sections (--sections, comma-separated; a later section builds what it needs if skipped):
  docstore  streaming import of the JSONL into the DocStore (docstore_import_s), then a reader
            that looks up --lookups random rows: docstore_rss_gb (its peak RSS), docstore_lookup_us.
  bm25      the chunked bounded-memory build (bm25_build_s; bm25_build_rss_gb = the building
            process's peak + bm25_build_workers tokenising processes at the largest one's peak), then a fresh
            process that loads it memory-mapped and searches the queries in batches of 64, top-3
            (bm25_qps_batch64, bm25_serve_rss_gb, bm25_serve_anon_gb).
  server    `serve(index, workers=1)` in a subprocess, 8 concurrent clients (RemoteRetriever, one
            thread each) sending the same batches of 64: server_qps, server_vs_inprocess
            (= server_qps / bm25_qps_batch64). Then the same with --workers processes: server_qps_workers,
            and their memory from /proc (psutil): server_workers_pss_gb (proportional set: shared
            pages counted once across the workers), server_worker_uss_gb (the largest private
            part), server_worker_rss_gb (the largest RSS, shared pages included), and
            server_worker_anon_gb (the largest anonymous part, /proc RssAnon: what a worker holds
            of its own; the index's pages are file-backed page cache, RssFile, never a copy, even
            where only one worker has touched them yet and so counts them as "private" in USS).
  dense     all-MiniLM-L6-v2 vectors of --dense-passages real-text passages, IVF-PQ (+ exact re-rank)
            against exact Flat search on the same queries: dense_recall10_vs_flat, dense_bytes_per_passage,
            dense_encode_passages_per_s and more (benchmarks/retrieval_scale_dense.py; its --dense-* options).

Queries: the questions of the shared QA sets (HotpotQA, 2Wiki, MuSiQue, NQ, PopQA, TriviaQA,
Bamboogle), cycled to --queries.

The last line is one JSON object with every key above (null where a section did not run), plus
passages, repeated (how many times the real pools were repeated) and sections.

Usage:
    python benchmarks/retrieval_scale.py --passages 20000
    python benchmarks/retrieval_scale.py --passages 5000000 --sections bm25,docstore,server --tmp /big/disk
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SECTIONS = ("docstore", "bm25", "server", "dense")
KEYS = {
    "docstore": ("docstore_import_s", "docstore_import_rss_gb", "docstore_rss_gb", "docstore_lookup_us"),
    "bm25": (
        "bm25_build_s",
        "bm25_build_rss_gb",
        "bm25_build_workers",
        "bm25_serve_rss_gb",
        "bm25_serve_anon_gb",
        "bm25_qps_batch64",
    ),
    "server": (
        "server_qps",
        "server_vs_inprocess",
        "server_workers",
        "server_qps_workers",
        "server_workers_pss_gb",
        "server_worker_uss_gb",
        "server_worker_rss_gb",
        "server_worker_anon_gb",
    ),
    "dense": ("dense_recall10_vs_flat", "dense_bytes_per_passage"),  # filled by the dense section
}
QA_FILES = (
    "hotpotqa/dev_distractor_ircot_subsample.jsonl",
    "2wikimultihopqa/dev_first1000_with_aliases.jsonl",
    "musique/dev_answerable.jsonl",
    "nq/test_flashrag_1k_subsample.jsonl",
    "popqa/test_flashrag_1k_subsample.jsonl",
    "triviaqa/test_flashrag_1k_subsample.jsonl",
    "bamboogle/test.jsonl",
)
K, BATCH, GB = 3, 64, 1024**3


# ------------------------------------------------------------------ the corpus and the queries


def shared_root() -> Path:
    from r3rag.data.shared import shared_data

    root = shared_data()
    if root is None or not list((root / "corpus").glob("*.jsonl")):
        raise SystemExit(
            "retrieval_scale: the shared pools ($R3RAG_DATA/corpus/*.jsonl, e.g. R3RAG_DATA=../shared/data) are missing"
        )
    return root


def write_corpus(root: Path, n: int, out: Path) -> int:
    """n FlashRAG rows ({"id", "contents": '"Title"\\ntext'}) cycling the real pools; returns the repeat count."""
    from r3rag.data.corpus import iter_corpus

    pool = [doc for f in sorted((root / "corpus").glob("*.jsonl")) for _, doc in iter_corpus(f)]
    with open(out, "w", encoding="utf-8") as f:
        for i in range(n):
            d = pool[i % len(pool)]
            rep = i // len(pool)
            row = {"id": d["id"] if rep == 0 else f"{d['id']}#{rep}", "contents": f'"{d["title"]}"\n{d["text"]}'}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return -(-n // len(pool))


def load_queries(root: Path, n: int) -> list[str]:
    from r3rag.util.jsonl import iter_jsonl

    qs = [r["question"] for name in QA_FILES if (root / name).is_file() for r in iter_jsonl(root / name)]
    return [qs[i % len(qs)] for i in range(n)]


# ------------------------------------------------------------------ phases (each in its own process)


def peak_rss() -> dict:
    """This process's peak RSS (ru_maxrss, KB on Linux) and its current private (anonymous) part."""
    anon = rss_anon("self")
    return {
        "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB,
        "anon_gb": None if anon is None else anon / GB,
    }


def rss_anon(pid: int | str) -> int | None:
    """Bytes of a process's resident anonymous memory (/proc/PID/status RssAnon); None where unreadable."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(x.split()[1]) * 1024 for x in status.splitlines() if x.startswith("RssAnon:")), None)


def phase_import(work: Path, args) -> dict:
    from r3rag.retrieval.docstore import import_corpus

    t0 = time.perf_counter()
    import_corpus(work / "corpus.jsonl", work / "index" / "docs")
    return {"seconds": time.perf_counter() - t0}


def phase_read(work: Path, args) -> dict:
    from r3rag.retrieval.docstore import DocStore

    store = DocStore(work / "index" / "docs")
    rows = random.Random(0).sample(range(len(store)), min(args.lookups, len(store)))
    t0 = time.perf_counter()
    chars = sum(len(store[i]["text"]) for i in rows)
    return {"lookup_us": (time.perf_counter() - t0) / len(rows) * 1e6, "chars": chars}


def phase_build(work: Path, args) -> dict:
    from r3rag.retrieval.bm25 import BM25Retriever
    from r3rag.retrieval.bm25_build import CHUNK_DOCS
    from r3rag.retrieval.docstore import DocStore

    store = DocStore(work / "index" / "docs")
    t0 = time.perf_counter()
    BM25Retriever.build_on_disk(store, work / "index")
    chunks = -(-len(store) // CHUNK_DOCS)
    workers = min(os.cpu_count() or 1, chunks) if chunks > 1 else 0  # tokenising processes (bm25_build)
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / GB  # the largest worker's peak
    return {"seconds": time.perf_counter() - t0, "workers": workers, "worker_rss_gb": child if workers else 0.0}


def phase_search(work: Path, args) -> dict:
    from r3rag.retrieval.bm25 import BM25Retriever

    queries = json.loads((work / "queries.json").read_text())
    r = BM25Retriever.load(work / "index")  # memory-mapped, as the server loads it
    r.search(queries[:BATCH], K)  # warm up
    t0 = time.perf_counter()
    for lo in range(0, len(queries), BATCH):
        r.search(queries[lo : lo + BATCH], K)
    return {"qps": len(queries) / (time.perf_counter() - t0)}


PHASES = {"import": phase_import, "read": phase_read, "build": phase_build, "search": phase_search}


def run_phase(name: str, work: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--phase", name, "--work", str(work), "--lookups", str(args.lookups)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"phase {name} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  {name}: {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()})}")
    return result


# ------------------------------------------------------------------ sections


def section_docstore(work: Path, args, state: dict) -> dict:
    imp = run_phase("import", work, args)
    read = run_phase("read", work, args)
    state["docstore"] = True
    return {
        "docstore_import_s": imp["seconds"],
        "docstore_import_rss_gb": imp["rss_gb"],
        "docstore_rss_gb": read["rss_gb"],
        "docstore_lookup_us": read["lookup_us"],
    }


def section_bm25(work: Path, args, state: dict) -> dict:
    if not state.get("docstore"):
        run_phase("import", work, args)
        state["docstore"] = True
    build = run_phase("build", work, args)
    search = run_phase("search", work, args)
    state["bm25"], state["qps"] = True, search["qps"]
    return {
        "bm25_build_s": build["seconds"],
        # the building process plus its tokenising workers (each counted at the largest one's peak)
        "bm25_build_rss_gb": build["rss_gb"] + build["workers"] * build["worker_rss_gb"],
        "bm25_build_workers": build["workers"],
        "bm25_serve_rss_gb": search["rss_gb"],
        "bm25_serve_anon_gb": search["anon_gb"],
        "bm25_qps_batch64": search["qps"],
    }


def section_server(work: Path, args, state: dict) -> dict:
    if not state.get("bm25"):
        section_bm25(work, args, state)
    queries = json.loads((work / "queries.json").read_text())
    batches = [queries[lo : lo + BATCH] for lo in range(0, len(queries), BATCH)]
    one = serve_and_load(work, batches, workers=1, clients=args.clients)
    many = serve_and_load(work, batches, workers=args.workers, clients=args.clients)
    return {
        "server_qps": one["qps"],
        "server_vs_inprocess": one["qps"] / state["qps"],
        "server_workers": args.workers,
        "server_qps_workers": many["qps"],
        "server_workers_pss_gb": many["pss_gb"],
        "server_worker_uss_gb": many["uss_gb"],
        "server_worker_rss_gb": many["rss_gb"],
        "server_worker_anon_gb": many["anon_gb"],
    }


def section_dense(work: Path, args, state: dict) -> dict:
    """IVF-PQ vs Flat on real MiniLM vectors: benchmarks/retrieval_scale_dense.py (its own --dense-* options)."""
    from retrieval_scale_dense import dense_section

    return dense_section(work, args, state)


def serve_and_load(work: Path, batches: list[list[str]], workers: int, clients: int) -> dict:
    """A server with `workers` processes; `clients` threads send all batches; queries/s and memory."""
    import psutil
    from server_load import free_port, run_clients, wait_until_up  # beside this script

    port = free_port()
    code = f"from r3rag.retrieval.serving import serve; serve({str(work / 'index')!r}, port={port}, workers={workers})"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout=1800)
        # A long timeout: at millions of passages a batch of 64 takes seconds, and 8 clients queue behind one worker.
        wall, _ = run_clients(url, batches, clients, K, timeout=600, max_batch=BATCH)
        procs = [psutil.Process(proc.pid)]
        if workers > 1:  # the workers, not multiprocessing's resource tracker
            procs = [c for c in procs[0].children() if "resource_tracker" not in " ".join(c.cmdline())]
        mems = [p.memory_full_info() for p in procs]
        anon = [rss_anon(p.pid) or 0 for p in procs]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # uvicorn's graceful shutdown waits for queued searches
            proc.kill()
            proc.wait()
    qps = sum(len(b) for b in batches) / wall
    out = {
        "qps": qps,
        "pss_gb": sum(m.pss for m in mems) / GB,
        "uss_gb": max(m.uss for m in mems) / GB,
        "rss_gb": max(m.rss for m in mems) / GB,
        "anon_gb": max(anon) / GB,
    }
    print(f"  server, {workers} worker(s), {clients} clients: {json.dumps({k: round(v, 3) for k, v in out.items()})}")
    return out


# ------------------------------------------------------------------ main


def dense_arguments(ap: argparse.ArgumentParser) -> None:
    from retrieval_scale_dense import add_arguments  # beside this script: run as a script, it is on sys.path

    add_arguments(ap)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    ap.add_argument("--queries", type=int, default=4096, help="queries searched (in batches of 64)")
    ap.add_argument("--lookups", type=int, default=20_000, help="random rows the DocStore reader looks up")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="server processes for the shared-index measurement")
    ap.add_argument("--tmp", default=None, help="where the temp dir goes (the corpus and index: ~1.5 KB a passage)")
    dense_arguments(ap)
    ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:  # a subprocess: one phase, one JSON line with its own peak RSS
        result = PHASES[args.phase](Path(args.work), args)
        print(json.dumps({**result, **peak_rss()}))
        return
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown or not sections:
        raise SystemExit(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    run(args, sections)


def run(args, sections: list[str]) -> None:
    root = shared_root()
    work = Path(tempfile.mkdtemp(prefix="r3rag-scale-", dir=args.tmp))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` still removes the temp dir (finally)
    try:
        t0 = time.perf_counter()
        repeated = write_corpus(root, args.passages, work / "corpus.jsonl")
        (work / "queries.json").write_text(json.dumps(load_queries(root, args.queries)))
        size = (work / "corpus.jsonl").stat().st_size / GB
        note = f"the shared pools repeated {repeated}x with distinct ids" if repeated > 1 else "the shared pools"
        print(f"corpus: {args.passages} passages ({size:.2f} GB JSONL) from {note}; {time.perf_counter() - t0:.0f}s")
        figures: dict = {"passages": args.passages, "repeated": repeated, "sections": sections}
        for name in SECTIONS:
            figures.update(dict.fromkeys(KEYS[name]))
        state: dict = {}
        for name in SECTIONS:  # in dependency order, whatever order --sections gives
            if name in sections:
                print(f"{name}:")
                figures.update(globals()[f"section_{name}"](work, args, state))
        disk = sum(p.stat().st_size for p in (work / "index").rglob("*") if p.is_file()) / GB
        print(f"index on disk (DocStore + BM25): {disk:.2f} GB")
        figures["index_disk_gb"] = disk
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    from r3rag.util.nojax import block_jax

    block_jax()  # before bm25s: it imports JAX when present, and forking after that deadlocks
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
