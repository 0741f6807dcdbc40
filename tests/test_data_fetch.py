"""`r3rag data fetch` against a stand-in hub on 127.0.0.1 (tests/hub_server.py), through the real download
code (huggingface_hub's HEAD and GET): conversion into what `world.source=files` reads, a download cut in
the middle and resumed (in the same run, and by a rerun), hashes refused, unknown names, no network,
HF_HUB_OFFLINE, and the on-request corpus. The test manifest pins the stand-in files' own hashes."""

import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest
import yaml

from r3rag.util.errors import UserError
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess
from tests.hub_server import HubServer

ROOT = Path(__file__).resolve().parents[1]
REPO, REV = "test-org/FlashRAG_datasets", "0123456789abcdef0123456789abcdef01234567"


def hotpot(i, split, content="sentences"):
    gold, titles = [f"Gold {split} {i} A", f"Gold {split} {i} B"], [f"Gold {split} {i} A", f"Gold {split} {i} B"]
    titles = titles + [f"Other {split} {i}"]
    sentences = [[f"{t} is where answer {split} {i} lives.", f" {t} has more."] for t in titles]
    meta = {"type": "bridge", "supporting_facts": {"title": gold, "sent_id": [0, 1]}}
    meta["context"] = {"title": titles, content: sentences}
    return {
        "id": f"{split}_{i}",
        "question": f"Which {split} thing {i}?",
        "golden_answers": [f"answer {split} {i}"],
        "metadata": meta,
    }


def musique(i, split):
    hops = [
        {"id": h, "question": f"hop {h} of {i}", "answer": f"a{h}", "paragraph_support_idx": h,
         "support_paragraph": {"idx": h, "title": f"Hop {split} {i}.{h}", "paragraph_text": f"Hop {h} of {i} says a{h}.", "is_supporting": True}}
        for h in range(2)
    ]  # fmt: skip
    return {
        "id": f"{split}_{i}",
        "question": f"Musique {split} {i}?",
        "golden_answers": [f"a1 {i}"],
        "metadata": {"question_decomposition": hops},
    }


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def wiki_zip() -> bytes:
    passages = [{"id": str(i), "contents": f'"Title {i}"\nPassage {i} text.'} for i in range(50)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("wiki18_100w.jsonl", jsonl(passages))
    return buf.getvalue()


FILES = {
    "hotpotqa/train.jsonl": jsonl(hotpot(i, "train") for i in range(8)),
    "hotpotqa/dev.jsonl": jsonl(hotpot(i, "dev") for i in range(12)),
    "musique/train.jsonl": jsonl(musique(i, "train") for i in range(6)),
    "musique/dev.jsonl": jsonl(musique(i, "dev") for i in range(6)),
    "2wikimultihopqa/dev.jsonl": jsonl(hotpot(i, "dev", content="content") for i in range(5)),
    "nq/test.jsonl": jsonl({"id": f"test_{i}", "question": f"nq {i}?", "golden_answers": [f"n{i}"]} for i in range(7)),
    "retrieval-corpus/wiki18_100w.zip": wiki_zip(),
}
GIT_FILES = {"2wikimultihopqa/dev.jsonl", "nq/test.jsonl"}  # kept in git: ETag = blob sha1, no sha256 pinned
OUTPUTS = {
    "hotpotqa": {
        "hotpotqa/train_hipporag_sample.jsonl": {"from": "hotpotqa/train.jsonl", "take": [0, 5]},
        "hotpotqa/dev_distractor_ircot_subsample.jsonl": {"from": "hotpotqa/dev.jsonl", "take": [0, 6]},
        "hotpotqa/dev_hoprag_examples.jsonl": {"from": "hotpotqa/dev.jsonl", "take": [6, 8]},
        "corpus/hotpotqa_dev_context_pool.jsonl": {"corpus_of": [{"from": "hotpotqa/dev.jsonl", "take": [0, 8]}]},
    },
    "musique": {
        "musique/train_hipporag_sample.jsonl": {"from": "musique/train.jsonl", "take": [0, 4]},
        "musique/dev_hoprag_examples.jsonl": {"from": "musique/dev.jsonl", "take": [0, 2]},
        "musique/dev_answerable.jsonl": {"from": "musique/dev.jsonl", "take": "all"},
        "corpus/musique_context_pool.jsonl": {
            "corpus_of": [
                {"from": "musique/dev.jsonl", "take": [0, 4]},
                {"from": "musique/train.jsonl", "take": [0, 4]},
            ]
        },
    },
    "2wikimultihopqa": {
        "2wikimultihopqa/dev_hoprag_examples.jsonl": {"from": "2wikimultihopqa/dev.jsonl", "take": [0, 2]},
        "corpus/hipporag_2wikimultihopqa_corpus.jsonl": {
            "corpus_of": [{"from": "2wikimultihopqa/dev.jsonl", "take": [0, 4]}]
        },
    },
    "nq": {"nq/test_flashrag_1k_subsample.jsonl": {"from": "nq/test.jsonl", "take": [0, 5]}},
    "wiki18": {
        "on_request": True,
        "corpus/wiki18_100w.jsonl": {"unzip": "retrieval-corpus/wiki18_100w.zip"},
        "corpus/flashrag_wiki18_sample1000.jsonl": {"sample_of": "retrieval-corpus/wiki18_100w.zip", "count": 10},
    },
}


def write_manifest(path: Path, files=FILES, **sha_override) -> Path:
    specs = {
        p: {"size": len(b), "sha256": None if p in GIT_FILES else sha_override.get(p, hashlib.sha256(b).hexdigest())}
        for p, b in files.items()
    }
    datasets = {}
    for name, outs in OUTPUTS.items():
        outs = dict(outs)
        on_request = outs.pop("on_request", False)
        datasets[name] = {"about": f"test {name}", "outputs": outs, **({"on_request": True} if on_request else {})}
    body = {
        "repo_id": REPO,
        "repo_type": "dataset",
        "revision": REV,
        "default": ["hotpotqa", "musique", "2wikimultihopqa"],
    }
    path.write_text(json.dumps({**body, "files": specs, "datasets": datasets}))
    return path


@pytest.fixture
def hub(monkeypatch):
    """The stand-in hub as HF_ENDPOINT, online (conftest sets HF_HUB_OFFLINE for every other test)."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("R3RAG_DATA", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.file_download.time.sleep", lambda s: None)  # its retry pause
    # huggingface_hub writes what it receives in chunks of this size (10 MB); a cut loses the partial
    # chunk. 100 bytes: a cut after 700 bytes keeps all 700.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 100)
    lfs = set(FILES) - GIT_FILES
    with HubServer(REPO, REV, FILES, lfs=lfs) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def fetch(names, root, manifest, **kw):
    from r3rag.data.fetch import fetch as run

    return run(names, root, manifest, **kw)


def test_full_fetch_writes_what_world_files_reads(hub, tmp_path):
    from r3rag.data.real import RealFiles, load_real
    from r3rag.util.jsonl import read_jsonl

    manifest, root = write_manifest(tmp_path / "m.json"), tmp_path / "data"
    assert fetch([], root, manifest) == root  # the default set
    files = RealFiles(
        train=["hotpotqa/train_hipporag_sample.jsonl", "musique/train_hipporag_sample.jsonl"],
        test=["hotpotqa/dev_distractor_ircot_subsample.jsonl", "musique/dev_hoprag_examples.jsonl",
              "2wikimultihopqa/dev_hoprag_examples.jsonl"],
        corpus=["corpus/hotpotqa_dev_context_pool.jsonl", "corpus/musique_context_pool.jsonl",
                "corpus/hipporag_2wikimultihopqa_corpus.jsonl"],
    )  # fmt: skip
    data = load_real(files, root)
    assert [len(data.splits[s]) for s in ("train", "test")] == [5 + 4, 6 + 2 + 2]
    titles = {d["title"] for d in data.docs}
    for q in data.splits["test"] + data.splits["train"]:
        assert q["metadata"]["supporting_titles"] and set(q["metadata"]["supporting_titles"]) <= titles, q["id"]
    hp = read_jsonl(root / "hotpotqa/dev_distractor_ircot_subsample.jsonl")[0]
    assert hp["id"].startswith("hotpotqa-dev_") and hp["metadata"]["orig_id"] == hp["id"][len("hotpotqa-") :]
    assert hp["metadata"]["source"] == f"{REPO}:hotpotqa/dev.jsonl@{REV}" and hp["metadata"]["split"] == "dev"
    assert len(hp["metadata"]["paragraphs"]) == 3 and "context" not in hp["metadata"]
    ms = read_jsonl(root / "musique/dev_hoprag_examples.jsonl")[0]
    assert ms["metadata"]["hops"] == 2 and all(p["is_supporting"] for p in ms["metadata"]["paragraphs"])
    # Disjoint ranks: the 6 subsample questions and the 2 examples share none; a rank order, fixed by the file.
    ids = [q["id"] for q in read_jsonl(root / "hotpotqa/dev_distractor_ircot_subsample.jsonl")]
    assert not set(ids) & {q["id"] for q in read_jsonl(root / "hotpotqa/dev_hoprag_examples.jsonl")}
    lock = json.loads((root / "flashrag.lock.json").read_text())
    assert (
        lock["revision"] == REV
        and lock["files"]["hotpotqa/dev.jsonl"]["sha256"] == hashlib.sha256(FILES["hotpotqa/dev.jsonl"]).hexdigest()
    )
    assert "git blob sha1" in lock["files"]["2wikimultihopqa/dev.jsonl"]["checked_by"]  # no sha256 pinned: the ETag
    assert "hotpotqa/dev_hoprag_examples.jsonl" in (root / "README.md").read_text()
    # A second fetch re-checks the files it has, downloads nothing and writes the same questions.
    gets = len([r for r in hub.requests if r[0] == "GET"])
    fetch([], root, manifest)
    assert len([r for r in hub.requests if r[0] == "GET"]) == gets
    assert [q["id"] for q in read_jsonl(root / "hotpotqa/dev_distractor_ircot_subsample.jsonl")] == ids


def test_a_download_cut_in_the_middle_resumes_from_the_byte_it_reached(hub, tmp_path):
    """huggingface_hub's GET retries a dropped connection with a Range header, in the same run."""
    manifest, root, path = write_manifest(tmp_path / "m.json"), tmp_path / "data", "hotpotqa/dev.jsonl"
    hub.faults[path] = ["drop:700"]
    fetch(["hotpotqa"], root, manifest)
    gets = hub.gets(path)
    assert "range" not in gets[0] and gets[1]["range"] == "bytes=700-"
    assert (root / "flashrag" / path).read_bytes() == FILES[path]


def test_an_interrupted_fetch_resumes_on_the_next_run(hub, tmp_path):
    """Cut, then the hub fails the retry: the bytes stay, and the rerun asks only for the rest."""
    manifest, root, path = write_manifest(tmp_path / "m.json"), tmp_path / "data", "hotpotqa/dev.jsonl"
    hub.faults[path] = ["drop:900", 503]
    out = r3rag_inprocess("data", "fetch", "hotpotqa", "--root", root, "--manifest", manifest)
    assert_one_line_error(out, path, "interrupted", "rerun to resume")
    (part,) = (root / "flashrag/hotpotqa").glob("dev.jsonl.*.incomplete")
    assert part.stat().st_size == 900 and not (root / "flashrag" / path).exists()
    out = r3rag_inprocess("data", "fetch", "hotpotqa", "--root", root, "--manifest", manifest)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(root)
    assert hub.gets(path)[-1]["range"] == "bytes=900-"
    assert (
        hashlib.sha256((root / "flashrag" / path).read_bytes()).hexdigest() == hashlib.sha256(FILES[path]).hexdigest()
    )
    assert not part.exists() and (root / "hotpotqa/dev_distractor_ircot_subsample.jsonl").is_file()


def test_a_file_whose_hash_differs_is_refused(hub, tmp_path):
    path, wrong = "hotpotqa/dev.jsonl", "0" * 64
    manifest, root = write_manifest(tmp_path / "m.json", **{path: wrong}), tmp_path / "data"
    # The hub's own sha256 (its ETag) already disagrees: refused before a byte is downloaded.
    out = r3rag_inprocess("data", "fetch", "hotpotqa", "--root", root, "--manifest", manifest)
    assert_one_line_error(out, path, "refused")
    assert hub.gets(path) == []
    # The hub claims the pinned hash but sends other bytes: downloaded, checked, refused, deleted.
    hub.etags[path] = wrong
    out = r3rag_inprocess("data", "fetch", "hotpotqa", "--root", root, "--manifest", manifest)
    assert_one_line_error(out, path, "sha256", "refused")
    assert len(hub.gets(path)) == 1 and not list((root / "flashrag/hotpotqa").glob("dev.jsonl*"))
    assert not (root / "hotpotqa/dev_distractor_ircot_subsample.jsonl").exists()


def test_a_file_changed_on_disk_is_refused(hub, tmp_path):
    manifest, root = write_manifest(tmp_path / "m.json"), tmp_path / "data"
    fetch(["nq"], root, manifest)  # nq/test.jsonl: no pinned sha256, learned on first fetch
    (root / "flashrag/nq/test.jsonl").write_bytes(b'{"id": "x", "question": "q", "golden_answers": ["a"]}\n')
    out = r3rag_inprocess("data", "fetch", "nq", "--root", root, "--manifest", manifest)
    assert_one_line_error(out, "nq/test.jsonl", "refused")


def test_unknown_name_lists_the_known_ones(hub, tmp_path):
    out = r3rag_inprocess(
        "data", "fetch", "hotpot", "--root", tmp_path, "--manifest", write_manifest(tmp_path / "m.json")
    )
    assert_one_line_error(out, "'hotpot'", "hotpotqa, musique, 2wikimultihopqa, nq, wiki18, all")
    assert hub.requests == []


def test_no_network_says_how_to_use_a_local_copy(hub, tmp_path, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    out = r3rag_inprocess("data", "fetch", "--root", tmp_path / "d", "--manifest", write_manifest(tmp_path / "m.json"))
    assert_one_line_error(out, "cannot reach the Hugging Face hub", "R3RAG_DATA")


def test_hf_hub_offline_is_respected(hub, tmp_path, monkeypatch):
    manifest, root = write_manifest(tmp_path / "m.json"), tmp_path / "data"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = r3rag_inprocess("data", "fetch", "nq", "--root", root, "--manifest", manifest)
    assert_one_line_error(out, "HF_HUB_OFFLINE", "R3RAG_DATA")
    assert hub.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    fetch(["nq"], root, manifest)
    (root / "nq/test_flashrag_1k_subsample.jsonl").unlink()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub files are here: offline rewrites the outputs
    before = len(hub.requests)
    fetch(["nq"], root, manifest)
    assert len(hub.requests) == before and (root / "nq/test_flashrag_1k_subsample.jsonl").is_file()


def test_wiki18_only_on_request_and_its_size_first(hub, tmp_path):
    manifest, root = write_manifest(tmp_path / "m.json"), tmp_path / "data"
    out = r3rag_inprocess("data", "fetch", "wiki18", "--root", root, "--manifest", manifest)
    assert_one_line_error(out, "wiki18", "--yes", "kB")
    assert hub.requests == []
    with pytest.raises(UserError, match="not fetched"):
        fetch(["wiki18"], root, manifest, confirm=lambda question: False)  # asked on a terminal, said no
    fetch([], root, manifest)  # the default set leaves it alone
    assert not hub.gets("retrieval-corpus/wiki18_100w.zip") and not (root / "corpus/wiki18_100w.jsonl").exists()
    fetch(["wiki18"], root, manifest, yes=True)
    from r3rag.data.corpus import load_corpus

    assert len(load_corpus(root / "corpus/wiki18_100w.jsonl")) == 50
    sample = load_corpus(root / "corpus/flashrag_wiki18_sample1000.jsonl")
    assert len(sample) == 10 and all(d["title"].startswith("Title") for d in sample)


def test_if_missing_is_a_no_op_where_a_data_root_is(hub, tmp_path, monkeypatch):
    local = tmp_path / "local"
    local.mkdir()
    monkeypatch.setenv("R3RAG_DATA", str(local))
    out = r3rag_inprocess("data", "fetch", "--if-missing", "--manifest", write_manifest(tmp_path / "m.json"))
    assert out.returncode == 0 and out.stdout.strip() == str(local) and hub.requests == []


def test_data_root_order(tmp_path, monkeypatch):
    """$R3RAG_DATA wins, else the fetched copy; a `shared/data` folder beside the checkout is never
    read unasked (the suite and CI point R3RAG_DATA at theirs)."""
    from r3rag.data import shared

    fetched = tmp_path / "fetched"
    monkeypatch.setattr(shared, "fetched_default", lambda: fetched)
    monkeypatch.delenv("R3RAG_DATA", raising=False)
    assert shared.shared_data() is None and shared.fetch_root() == fetched
    fetched.mkdir()  # a fetch that never reached the hub: not a data root yet
    assert shared.shared_data() is None
    (fetched / "flashrag.lock.json").write_text("{}")
    assert shared.shared_data() == fetched
    monkeypatch.setenv("R3RAG_DATA", str(tmp_path))
    assert shared.shared_data() == tmp_path == shared.fetch_root()


def test_the_product_ignores_a_shared_folder_beside_the_checkout(hub, tmp_path, monkeypatch):
    """With R3RAG_DATA unset, a `../shared/data` next to the clone is neither read nor named: the data
    root is the fetched copy, and `data fetch` says nothing about another folder read first."""
    from r3rag.data import shared

    beside = shared._REPO.parent / "shared" / "data"  # this project's offline copy, where there is one
    fetched = tmp_path / "fetched"
    monkeypatch.setattr(shared, "fetched_default", lambda: fetched)
    assert shared.shared_data() is None  # hub: R3RAG_DATA unset, whether or not `beside` exists
    manifest = write_manifest(tmp_path / "m.json")
    out = r3rag_inprocess("data", "fetch", "hotpotqa", "--manifest", manifest)
    assert out.returncode == 0 and out.stdout.strip() == str(fetched), out.stderr
    assert str(beside) not in out.stderr and "pipelines read" not in out.stderr and shared.shared_data() == fetched
    out = r3rag_inprocess("data", "fetch", "--if-missing", "hotpotqa", "--manifest", manifest)
    assert out.returncode == 0 and out.stdout.strip() == str(fetched)


def test_the_shipped_manifest_writes_every_file_the_real_pipelines_read():
    """make data (the default set) gives the real pipelines every file their world names."""
    from r3rag.data.manifest import load_manifest

    m = load_manifest()
    assert len(m.revision) == 40 and m.repo_id == "RUC-NLPIR/FlashRAG_datasets"
    written = {p for name in m.default for p in m.datasets[name]["outputs"]}
    for pipeline in sorted((ROOT / "pipelines").glob("real-smollm2*.yaml")):
        world = yaml.safe_load(pipeline.read_text()).get("world", {})
        for split in ("train", "dev", "test", "pool", "corpus"):
            assert set(world.get(split, [])) <= written, (pipeline.name, split)


def test_importer_reads_flashrag_column_layout(tmp_path):
    """`r3rag import` (and world.source=files) read FlashRAG's hub rows as they are."""
    from r3rag.data.importers import import_questions

    path = tmp_path / "dev.jsonl"
    path.write_bytes(jsonl([hotpot(0, "dev"), hotpot(1, "dev", content="content"), musique(2, "dev")]))
    (hp, wiki, ms), fmt = import_questions(path)
    assert fmt == "flashrag" and hp["metadata"]["supporting_titles"] == ["Gold dev 0 A", "Gold dev 0 B"]
    assert [p["is_supporting"] for p in hp["metadata"]["paragraphs"]] == [True, True, False]
    assert hp["metadata"]["paragraphs"][0]["text"] == "Gold dev 0 A is where answer dev 0 lives. Gold dev 0 A has more."
    assert wiki["metadata"]["paragraphs"][2]["title"] == "Other dev 1"
    assert [p["title"] for p in ms["metadata"]["paragraphs"]] == ["Hop dev 2.0", "Hop dev 2.1"]
    assert "support_paragraph" not in ms["metadata"]["question_decomposition"][0]


def test_downloads_show_progress_in_a_log(hub, tmp_path, monkeypatch):
    """Off a terminal (a log file) each download and conversion ends with a line: what, how much, how fast."""
    from rich.console import Console

    from r3rag.util import progress

    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)
    log = io.StringIO()
    fetch(["hotpotqa"], tmp_path / "data", write_manifest(tmp_path / "m.json"), console=Console(file=log, width=200))
    lines = log.getvalue().splitlines()
    assert any(
        line.startswith(f"fetch: {REPO}@0123456:hotpotqa/dev.jsonl 1/1 MB") and "in all" in line for line in lines
    )
    assert any(line.startswith("convert: hotpotqa/train.jsonl") for line in lines)
