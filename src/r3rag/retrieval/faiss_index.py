"""faiss indexes chosen by one setting, trained on a sample, filled chunk by chunk, served memory-mapped.

`index_type`: flat | hnsw | ivf-flat | ivf-sq8 | ivf-pq ("ivf" is ivf-flat, the older name). The
options, all in `IndexSpec` (0 = chosen from the corpus size):

    nlist       IVF lists; 0 = 4 * sqrt(N), at most one list per 39 training vectors
    pq_m        IVF-PQ sub-quantizers = bytes per code; 0 = the largest divisor of dim up to 64
    nprobe      IVF lists searched per query
    hnsw_m      HNSW graph degree; ef_search its search beam (raised to k when smaller)
    refine_k    re-rank k * refine_k candidates by exact inner product with the fp16 vectors kept beside
                the index (vectors.npy, memory-mapped): PQ's recall at PQ's RAM
    train_size  vectors sampled to train IVF / SQ / PQ; 0 = 39 per list for ivf-flat, 40 per list
                and at least 20k for the codebooks of ivf-sq8 / ivf-pq
    gpu         "auto" with faiss-gpu and a GPU: trained and filled on GPU 0, served by
                index_cpu_to_all_gpus (sharded over every GPU, fp16); "never": the CPU only

Bytes per passage in the index file (codes + the 8-byte id IVF lists keep): flat 4*dim, ivf-flat
4*dim + 8, ivf-sq8 dim + 8, ivf-pq pq_m + 8, hnsw 4*dim + ~8*hnsw_m. `read` maps the file
(IO_FLAG_MMAP_IFC) instead of reading it, so a 21M-passage index serves from the page cache.

Usage:
    spec = IndexSpec("ivf-pq", refine_k=4); spec.check()
    index, resolved = build(shards, spec)          # shards: r3rag.retrieval.encode.Shards
    write(index, path); index = read(path)
    scores, ids = search(index, resolved, queries, k, vectors)
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from r3rag.util.durable import fsync_path
from r3rag.util.errors import UserError
from r3rag.util.extras import require

if TYPE_CHECKING:
    import faiss

INDEX_TYPES = ("flat", "hnsw", "ivf-flat", "ivf-sq8", "ivf-pq")
ALIASES = {"ivf": "ivf-flat"}
MIN_POINTS_PER_LIST = 39  # faiss warns below this many training points per k-means centroid


def faiss_module():
    """faiss, or the one-line error naming the [dense] extra. Imported where an index is built or read,
    so `import r3rag.retrieval.dense` (the Encoder) works without it."""
    return require("faiss", "dense", "dense retrieval (index backend=dense or hybrid)")


@dataclass
class IndexSpec:
    index_type: str = "flat"
    nlist: int = 0
    pq_m: int = 0
    nprobe: int = 32
    hnsw_m: int = 32
    ef_search: int = 128
    refine_k: int = 0
    train_size: int = 0
    gpu: str = "auto"

    def check(self) -> IndexSpec:
        faiss_module()  # without the [dense] extra: one line now, not after every passage is encoded
        self.index_type = ALIASES.get(self.index_type, self.index_type)
        if self.index_type not in INDEX_TYPES:
            raise UserError(f"dense index_type {self.index_type!r}: expected one of {', '.join(INDEX_TYPES)}")
        for name in ("nlist", "pq_m", "refine_k", "train_size"):
            if getattr(self, name) < 0:
                raise UserError(f"dense {name} {getattr(self, name)}: must be 0 (automatic) or more")
        for name in ("nprobe", "hnsw_m", "ef_search"):
            if getattr(self, name) < 1:
                raise UserError(f"dense {name} {getattr(self, name)}: must be at least 1")
        if self.gpu not in ("auto", "never"):
            raise UserError(f"dense gpu {self.gpu!r}: expected auto or never")
        return self


def resolve(spec: IndexSpec, n: int, dim: int) -> dict:
    """The concrete settings for n vectors of dim: sizes filled in, and the faiss factory string."""
    out = asdict(spec)
    kind = spec.index_type
    if kind.startswith("ivf"):
        nlist = spec.nlist or max(1, int(4 * math.sqrt(n)))
        out["nlist"] = max(1, min(nlist, n // MIN_POINTS_PER_LIST, 1 << 20))
        out["nprobe"] = min(spec.nprobe, out["nlist"])
    if kind == "ivf-pq":
        m = spec.pq_m or max(d for d in range(1, min(dim, 64) + 1) if dim % d == 0)
        if dim % m:
            raise UserError(f"dense pq_m {m}: must divide the vector dimension {dim}")
        out["pq_m"] = m
        # 8-bit codes need 256 centroids per sub-quantizer: a tiny corpus gets fewer bits.
        out["pq_nbits"] = max(1, min(8, int(math.log2(max(n, 2) / 4))))
    if kind.startswith("ivf"):  # SQ and PQ codebooks want more than the lists' 39 a centroid
        need = MIN_POINTS_PER_LIST * out["nlist"] + 1 if kind == "ivf-flat" else max(40 * out["nlist"], 20_000)
        out["train_size"] = min(n, spec.train_size or need)
    else:
        out["train_size"] = 0  # flat and HNSW need no training
    out["factory"] = factory_string(out, dim)
    return out


def factory_string(s: dict, dim: int) -> str:
    match s["index_type"]:
        case "flat":
            return "Flat"
        case "hnsw":
            return f"HNSW{s['hnsw_m']},Flat"
        case "ivf-flat":
            return f"IVF{s['nlist']},Flat"
        case "ivf-sq8":
            return f"IVF{s['nlist']},SQ8"
        case "ivf-pq":
            return f"IVF{s['nlist']},PQ{s['pq_m']}x{s['pq_nbits']}"


def build(shards, spec: IndexSpec) -> tuple[faiss.Index, dict]:
    """Train on a sample of the shards, then add them chunk by chunk (on the GPUs when there are some)."""
    faiss = faiss_module()
    s = resolve(spec.check(), shards.num_docs, shards.dim)
    index = faiss.index_factory(shards.dim, s["factory"], faiss.METRIC_INNER_PRODUCT)
    _training_settings(index)
    # One GPU, not sharded: shards trained apart would each get their own coarse quantizer.
    work, _res = _to_one_gpu(index) if s["gpu"] == "auto" else (index, None)
    if not index.is_trained:
        work.train(shards.sample(s["train_size"], seed=0))
    for _, vecs in shards.chunks():
        work.add(vecs)
    if work is not index:
        index = faiss.index_gpu_to_cpu(work)
    return index, s


def _to_one_gpu(index: faiss.Index):
    """(the index on GPU 0, its resources), or (the index, None) without faiss-gpu or a GPU."""
    faiss = faiss_module()
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        return index, None
    res = faiss.StandardGpuResources()  # must outlive the GPU index
    co = faiss.GpuClonerOptions()
    co.useFloat16 = True
    try:
        return faiss.index_cpu_to_gpu(res, 0, index, co), res
    except RuntimeError:  # a type or size faiss-gpu lacks (HNSW, some PQ sizes): build on the CPU
        return index, None


def _training_settings(index: faiss.Index) -> None:
    """Small corpora train with fewer points per centroid than faiss likes (the sizes in `resolve`
    already keep what matters: its warnings would be noise). index_factory turns on polysemous
    training for IVF-PQ, which only serves Hamming-filtered search (unused here) and takes minutes
    at 64 sub-quantizers: off."""
    faiss = faiss_module()
    try:
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:  # not an IVF index
        return
    ivf.cp.min_points_per_centroid = 1
    if hasattr(ivf, "pq"):
        ivf.pq.cp.min_points_per_centroid = 1
        ivf.do_polysemous_training = False


def write(index: faiss.Index, path: Path) -> None:
    """Write the index whole or not at all (a .part file renamed into place)."""
    faiss = faiss_module()
    part = Path(path).with_name(Path(path).name + ".part")
    faiss.write_index(index, str(part))
    fsync_path(part)
    os.replace(part, path)


def read(path: Path, mmap: bool = True) -> faiss.Index:
    """The index at path, memory-mapped where this faiss can; a truncated or foreign file is one line."""
    faiss = faiss_module()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: faiss index file not found")
    flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as e:
        raise UserError(f"{path}: not a readable faiss index (truncated or corrupt: {_read_failure(str(e))})") from None


def _read_failure(message: str) -> str:
    """faiss's C++ message (function signatures, source lines) boiled down to what went wrong."""
    short = re.search(r"read error in [^:]*: (\d+) != (\d+)", message)
    if short:
        return f"the file ends early, {short[1]} of {short[2]} items read"
    kind = re.search(r"Index type (\S+) \(.*\) not recognized", message)
    if kind:
        return f"unknown index type {kind[1]}"
    return message.rsplit(": ", 1)[-1][:200] or "unreadable"


def search(index: faiss.Index, s: dict, queries: np.ndarray, k: int, vectors=None, on_gpu: bool = False):
    """Top-k (scores, ids) per query; with refine_k and vectors, PQ candidates re-scored exactly."""
    faiss = faiss_module()
    k = min(k, index.ntotal)
    fetch = min(index.ntotal, k * s["refine_k"]) if s.get("refine_k") and vectors is not None else k
    params = faiss.GpuParameterSpace() if on_gpu else faiss.ParameterSpace()
    if s["index_type"].startswith("ivf"):
        params.set_index_parameter(index, "nprobe", s["nprobe"])
    elif s["index_type"] == "hnsw":
        params.set_index_parameter(index, "efSearch", max(s["ef_search"], fetch))
    scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), fetch)
    if fetch == k:
        return scores, ids
    return rerank(queries, ids, vectors, k)


def rerank(queries: np.ndarray, ids: np.ndarray, vectors: np.ndarray, k: int):
    """Exact inner products of each query with its candidates' stored vectors; the best k of them."""
    safe = np.where(ids >= 0, ids, 0)
    flat = np.unique(safe)  # sorted: one pass over the memory-mapped file
    pos = np.searchsorted(flat, safe)
    cand = np.asarray(vectors[flat], dtype=np.float32)[pos]  # (queries, fetch, dim)
    scores = np.einsum("qd,qcd->qc", queries.astype(np.float32), cand)
    scores[ids < 0] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    out_scores = np.take_along_axis(scores, top, 1)
    out_ids = np.take_along_axis(ids, top, 1)
    out_ids[~np.isfinite(out_scores)] = -1
    return out_scores, out_ids


def _to_gpus(index: faiss.Index) -> faiss.Index:
    """The index on every GPU faiss sees (sharded, fp16), or itself on a CPU-only faiss."""
    faiss = faiss_module()
    if not hasattr(faiss, "index_cpu_to_all_gpus") or faiss.get_num_gpus() == 0:
        return index
    co = faiss.GpuMultipleClonerOptions()
    co.shard, co.useFloat16 = True, True
    try:
        return faiss.index_cpu_to_all_gpus(index, co=co)
    except RuntimeError:  # a type or size faiss-gpu lacks (HNSW, some PQ sizes): stay on the CPU
        return index


def to_gpus(index: faiss.Index, s: dict) -> faiss.Index:
    """For serving: the index on the GPUs when `gpu` is auto and faiss-gpu sees some."""
    return _to_gpus(index) if s.get("gpu", "auto") == "auto" else index


def kind_of(index: faiss.Index) -> str:
    """The index_type whose search settings (nprobe, efSearch) apply to an index made elsewhere."""
    name = type(faiss_module().downcast_index(index)).__name__
    if "HNSW" in name:
        return "hnsw"
    if "IVF" in name:
        return "ivf-pq" if "PQ" in name else "ivf-sq8" if "Scalar" in name else "ivf-flat"
    return "flat"


def file_bytes_per_passage(path: Path, n: int) -> float:
    return Path(path).stat().st_size / max(n, 1)
