"""The dense section of benchmarks/retrieval_scale.py: IVF-PQ against exact search on real MiniLM vectors.

--dense-passages passages of the shared pools' real text (beyond the ~13k pool passages, each further
passage joins the second half of one pool passage to the first half of another: real words, and no
two passages alike, so no ties blur recall) are encoded by all-MiniLM-L6-v2 into resumable fp16 shards
(encode passages/s). The same --dense-queries real questions are searched top-10 in an exact Flat
index and in IVF-PQ (nprobe --dense-nprobe), read back memory-mapped, without and with the exact
re-rank of k x --dense-refine-k candidates from the fp16 vectors.

Keys: dense_recall10_vs_flat (IVF-PQ + re-rank vs Flat, mean over queries of |top10 n top10| / 10),
dense_recall10_pq_only, dense_bytes_per_passage (the IVF-PQ index file / passages: what sits in RAM
or page cache), dense_refine_bytes_per_passage (the fp16 vectors the re-rank reads, on disk),
dense_encode_passages_per_s, dense_build_s (train + add), dense_qps_batch64 (IVF-PQ + re-rank, the
queries already encoded), dense_flat_qps_batch64, and the settings used (dense_passages, dense_nlist,
dense_pq_m, dense_nprobe, dense_refine_k, dense_synthesized).

Usage:
    python benchmarks/retrieval_scale.py --passages 200000 --sections dense --dense-passages 200000
    python benchmarks/retrieval_scale_dense.py --dense-passages 5000      # this section alone
    ... --dense-shards /big/disk/shards    # keep the encoded shards: a killed or repeated run resumes
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

import numpy as np

K, BATCH, GB = 10, 64, 1024**3


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dense-passages", type=int, default=200_000, help="passages encoded for the dense section")
    ap.add_argument("--dense-queries", type=int, default=1000, help="questions searched (top-10)")
    ap.add_argument("--dense-nprobe", type=int, default=64)
    ap.add_argument("--dense-refine-k", type=int, default=10, help="re-rank k x this many IVF-PQ candidates")
    ap.add_argument("--dense-pq-m", type=int, default=0, help="bytes per PQ code (0 = automatic: 64 for MiniLM)")
    ap.add_argument("--dense-chunk-size", type=int, default=20_000, help="passages per encoded shard")
    ap.add_argument("--dense-shards", default=None, help="keep the encoded shards here (default: the temp dir)")
    ap.add_argument("--dense-encoder", default="", help="the encoder's directory (default: all-MiniLM-L6-v2's package)")


def dense_texts(root: Path, n: int) -> tuple[list[str], int]:
    """n distinct real-text passages; how many of them were synthesized from two pool passages."""
    from r3rag.data.corpus import iter_corpus

    files = sorted((root / "corpus").glob("*.jsonl"))
    pool = list(dict.fromkeys(f"{d['title']} {d['text']}" for f in files for _, d in iter_corpus(f)))  # no twins
    words = [p.split() for p in pool]
    out = pool[:n]
    rep = 0
    while len(out) < n:
        rep += 1
        for i in range(min(len(pool), n - len(out))):
            a, b = words[i], words[(i * 31 + rep * 7919) % len(pool)]
            out.append(" ".join(a[len(a) // 2 :] + b[: len(b) // 2]))
    return out, max(0, n - len(pool))


def dense_section(work: Path, args, state: dict) -> dict:
    from r3rag.retrieval import faiss_index
    from r3rag.retrieval.dense import Encoder, use_all_cores
    from r3rag.retrieval.encode import encode_corpus

    root = _shared_root()
    texts, synthesized = dense_texts(root, args.dense_passages)
    queries = _queries(root, args.dense_queries)
    enc = Encoder(args.dense_encoder)
    if enc.device == "cpu":
        use_all_cores()
    shard_dir = Path(args.dense_shards) if args.dense_shards else work / "dense_shards"
    t0 = time.perf_counter()
    fingerprint = hashlib.sha256(json.dumps([len(texts), texts[0], texts[-1]]).encode()).hexdigest()
    shards = encode_corpus(texts, shard_dir, enc, fingerprint, args.dense_chunk_size, progress=_chunk_lines(len(texts)))
    encode_s = time.perf_counter() - t0
    rate = shards.encoded_rows / encode_s if shards.encoded_rows else None  # None: all chunks were on disk
    print(f"  encoded {len(texts)} passages ({synthesized} synthesized), {shards.encoded} chunks now: {encode_s:.0f}s")
    q = enc.encode(queries, 64, True)

    flat, s_flat = faiss_index.build(shards, faiss_index.IndexSpec("flat", gpu="never"))
    want, flat_qps = _search_all(flat, s_flat, q, None)
    del flat
    spec = faiss_index.IndexSpec("ivf-pq", pq_m=args.dense_pq_m, nprobe=args.dense_nprobe, refine_k=args.dense_refine_k)
    t0 = time.perf_counter()
    index, s = faiss_index.build(shards, spec)
    build_s = time.perf_counter() - t0
    faiss_index.write(index, work / "dense_pq.index")
    del index
    mapped = faiss_index.read(work / "dense_pq.index")  # as a server loads it
    shards.concat_to(work / "dense_vectors.npy")
    vectors = np.load(work / "dense_vectors.npy", mmap_mode="r")
    got, qps = _search_all(mapped, s, q, vectors)
    pq_only, _ = _search_all(mapped, {**s, "refine_k": 0}, q, None)
    n = len(texts)
    out = {
        "dense_recall10_vs_flat": _recall(got, want),
        "dense_recall10_pq_only": _recall(pq_only, want),
        "dense_bytes_per_passage": (work / "dense_pq.index").stat().st_size / n,
        "dense_refine_bytes_per_passage": (work / "dense_vectors.npy").stat().st_size / n,
        "dense_encode_passages_per_s": rate,
        "dense_build_s": build_s,
        "dense_qps_batch64": qps,
        "dense_flat_qps_batch64": flat_qps,
        "dense_passages": n,
        "dense_synthesized": synthesized,
        "dense_nlist": s["nlist"],
        "dense_pq_m": s["pq_m"],
        "dense_nprobe": s["nprobe"],
        "dense_refine_k": s["refine_k"],
    }
    print(f"  {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()})}")
    return out


def _chunk_lines(total: int):
    """A line a chunk, so a log shows how far an hours-long CPU encoding has got (resumed chunks count at once)."""
    t0, done = time.perf_counter(), [0]

    def advance(rows: int) -> None:
        done[0] += rows
        print(f"  encode: {done[0]}/{total} passages on disk, {time.perf_counter() - t0:.0f}s", flush=True)

    return advance


def _search_all(index, s: dict, q: np.ndarray, vectors) -> tuple[np.ndarray, float]:
    from r3rag.retrieval import faiss_index

    faiss_index.search(index, s, q[:BATCH], K, vectors)  # warm up
    t0 = time.perf_counter()
    ids = np.concatenate(
        [faiss_index.search(index, s, q[lo : lo + BATCH], K, vectors)[1] for lo in range(0, len(q), BATCH)]
    )
    return ids, len(q) / (time.perf_counter() - t0)


def _recall(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g.tolist()) & set(w.tolist())) / K for g, w in zip(got, want)]))


def _shared_root() -> Path:
    from r3rag.data.shared import shared_data

    root = shared_data()
    if root is None or not list((root / "corpus").glob("*.jsonl")):
        raise SystemExit(
            "dense: the shared pools ($R3RAG_DATA/corpus/*.jsonl, e.g. R3RAG_DATA=../shared/data) are missing"
        )
    return root


def _queries(root: Path, n: int) -> list[str]:
    from r3rag.util.jsonl import iter_jsonl

    files = sorted(p for p in root.glob("*/*.jsonl") if p.parent.name != "corpus")
    qs = list(dict.fromkeys(r["question"] for p in files for r in iter_jsonl(p) if "question" in r))  # distinct
    return [qs[i % len(qs)] for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="r3rag-dense-") as tmp:
        figures = dense_section(Path(tmp), args, {})
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
