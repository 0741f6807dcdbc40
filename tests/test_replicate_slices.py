"""An experiment run slice by slice (r3rag.experiments.slices: cut, file, merge; status.slices): each
slice's results file, its merge into the results file the whole run would write, `--status`, bad
files and a slice run twice. Stand-in eval artifacts (metrics.json, predictions.jsonl, manifests)
take the place of trained ones: nothing here trains, every test runs in about a second."""

import json
import random
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from r3rag.util.errors import UserError
from tests.cli_helpers import assert_one_line_error, r3rag_inprocess

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["world", "index", "synthesize", "sft", "rl", "eval"]
COLD = ["world", "index", "synthesize", "sft", "eval"]
GRPO, SFT, CONTROL, READER = "GRPO", "SFT cold start", "Control: more SFT", "Reader, top-12"
MACHINE = {"cpu": "Stand-in EPYC", "arch": "x86_64", "cores": 2, "vector": "avx2", "gpu": None, "torch": "2.x"}


def _pipeline(tmp_path: Path, **changes) -> Path:
    """replicate.yaml in small: two seeds, GRPO and its control in one slice, the dev eval of the
    same policy and a reader that starts from the cold start in another."""
    data = {
        "name": "tiny",
        "stages": STAGES,
        "seeds": {"values": [0, 1], "set": ["synthesize.seed={seed}", "sft.seed={seed}", "rl.seed={seed}"]},
        "world": {"seed": 1},
        "index": {"name": "bm25"},
        "sft": {"layers": 1, "hidden": 32},
        "eval": {"limit": 40},
        "variants": {
            "main": {"set": ["eval.systems=[sft, rl]"]},
            "more": {"stages": COLD, "set": ["sft.model=${main.sft}/model", "sft.lr=1.0e-4", "eval.systems=[sft]"]},
            "dev": {"set": ["eval.split=dev", "eval.systems=[sft, rl]"]},
            "reader": {
                "stages": COLD,
                "set": ["synthesize.reader=rag", "sft.model=${main.sft}/model", "eval.systems=[rag]", "eval.rl="],
            },
        },
        "table": {SFT: "main/sft", GRPO: "main/rl", CONTROL: "more/sft", "GRPO, dev": "dev/rl", READER: "reader/rag"},
        "compare": [[GRPO, SFT], [GRPO, CONTROL], [SFT, READER]],
        "results": {"path": "results/tiny.json", "tables": {"head": [GRPO, SFT]}},
        "slices": {
            "grpo-s{seed}": {"variants": ["main", "more"], "minutes": 90},
            "rest-s{seed}": {"variants": ["dev", "reader"]},
        },
        **changes,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _ref(runs: Path, stage: str, id_: str, config: dict, metrics=None, inputs=None) -> SimpleNamespace:
    """A stand-in artifact: a folder with its manifest (found by train_seconds through a model path)."""
    folder = runs / stage / id_
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {"id": id_, "stage": stage, "content_hash": id_, "config": config, "metrics": metrics or {}}
    manifest.update(seconds={"sft": 600.0, "rl": 1800.0}.get(stage, 30.0), finished_at=1000.0, inputs=inputs or {})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return SimpleNamespace(stage=stage, id=id_, path=folder, manifest=manifest)


def _eval(runs: Path, variant: str, systems: list[str], split: str, sft, rl, index) -> SimpleNamespace:
    """An eval of 40 questions: per-question EM (0/1) and F1 drawn from a seeded generator per system."""
    from r3rag.core.metrics import mean_ci

    inputs = {"sft": {"id": sft.id}, "index": {"id": index.id}, **({"rl": {"id": rl.id}} if rl else {})}
    ev = _ref(runs, "eval", f"eval-{variant.replace('#', '-')}", {"split": split, "limit": 40}, inputs=inputs)
    rows, metrics = [], {}
    for system in systems:
        rng = random.Random(f"{variant}/{system}")
        em = [float(rng.random() < 0.6) for _ in range(40)]
        f1 = [max(e, round(rng.random() / 2, 3)) for e in em]
        rows += [{"system": system, "id": f"{split}{i}", "em": e, "f1": f} for i, (e, f) in enumerate(zip(em, f1))]
        mean = round(sum(em) / 40, 4)
        metrics[system] = {"em": mean, "em_ci": list(mean_ci(em)), "f1": round(sum(f1) / 40, 4), "n": 40}
        metrics[system].update(searches=2.0, by_hops={"2": {"em": mean, "f1": mean, "n": 40}}, seconds=12.0)
    (ev.path / "metrics.json").write_text(json.dumps({"systems": metrics}))
    (ev.path / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ev


def _built(runs: Path) -> dict:
    """Every variant's artifacts at both seeds, shared where a real run shares them (main and dev
    train the same cold start and GRPO; the control and the reader start from that cold start)."""
    world, index = _ref(runs, "world", "world-1", {"seed": 1}), _ref(runs, "index", "index-1", {})
    built = {}
    for s in (0, 1):
        syn = _ref(runs, "synthesize", f"syn-s{s}", {"seed": s})
        sft = _ref(runs, "sft", f"sft-s{s}", {"seed": s}, {"steps": 20})
        rl = _ref(runs, "rl", f"rl-s{s}", {"seed": s}, {"steps": 10, "kept_dev_em": 0.5})
        cold = {"model": str(sft.path / "model"), "seed": s}
        more = _ref(runs, "sft", f"more-s{s}", {**cold, "lr": 1e-4}, {"steps": 8})
        rsyn = _ref(runs, "synthesize", f"rsyn-s{s}", {"seed": s, "reader": "rag"})
        reader = _ref(runs, "sft", f"reader-s{s}", cold, {"steps": 20})
        base = {"world": world, "index": index, "synthesize": syn}
        built[f"main#s{s}"] = {
            **base,
            "sft": sft,
            "rl": rl,
            "eval": _eval(runs, f"main#s{s}", ["sft", "rl"], "test", sft, rl, index),
        }
        built[f"more#s{s}"] = {
            **base,
            "sft": more,
            "eval": _eval(runs, f"more#s{s}", ["sft"], "test", more, None, index),
        }
        built[f"dev#s{s}"] = {
            **base,
            "sft": sft,
            "rl": rl,
            "eval": _eval(runs, f"dev#s{s}", ["sft", "rl"], "dev", sft, rl, index),
        }
        reval = _eval(runs, f"reader#s{s}", ["rag"], "test", reader, None, index)
        built[f"reader#s{s}"] = {**base, "synthesize": rsyn, "sft": reader, "eval": reval}
    return built


def _whole_run(path: Path, built: dict, tmp_path: Path) -> dict:
    """The results file one run of the whole experiment writes from these artifacts (as
    r3rag.experiments.experiment.run_experiment: its table's rows and comparisons, then write_results)."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.results.compare import build_comparisons, compare_spec
    from r3rag.experiments.results.file import results_spec, write_results
    from r3rag.experiments.results.table import build_rows
    from r3rag.experiments.slices.cut import load_slices

    experiment, _ = load_slices(path, load_pipeline(path))
    table = experiment["table"]
    rows, pairs = build_rows(table, built, path), compare_spec(path, experiment)
    about = {"date": "2026-12-03", "machine": "m", "wall_seconds": 1.0, "compute_seconds": 1.0}
    folder = tmp_path / "table"
    folder.mkdir()
    (folder / "table.json").write_text(
        json.dumps({"rows": rows, "comparisons": build_comparisons(pairs, table, built), **about})
    )
    spec = {**results_spec(path, experiment), "path": tmp_path / "whole.json"}
    return json.loads(write_results(spec, path, experiment, built, SimpleNamespace(id="t", path=folder)).read_text())


def _write_slice(path: Path, built: dict, name: str, finished: str = "2026-12-03T10:00:00Z", **changes) -> Path:
    """Slice `name`'s file, as `r3rag run --slice` writes it after building these artifacts."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.cut import fingerprint, load_slices, slice_experiment
    from r3rag.experiments.slices.file import slice_record, write_slice

    experiment, slices = load_slices(path, load_pipeline(path))
    sub = slice_experiment(path, experiment, slices[name])
    mine = {v: {st: built[v][st] for st in spec["stages"]} for v, spec in sub["variants"].items()}
    record = slice_record(path, experiment, slices[name], sub, fingerprint(path, sub, []), mine, started=0.0)
    record.update(finished=finished, **changes)
    return write_slice(Path("results/tiny") / f"{name}.json", record)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # results/tiny/ and results/tiny.json are relative to the working directory
    monkeypatch.setattr("r3rag.experiments.slices.file.machine_info", lambda: dict(MACHINE))
    monkeypatch.setenv("COLUMNS", "250")
    return SimpleNamespace(path=_pipeline(tmp_path).relative_to(tmp_path), built=_built(tmp_path / "runs"))


def _all_slices(tiny) -> None:
    for name in ("grpo-s0", "grpo-s1", "rest-s0", "rest-s1"):
        _write_slice(tiny.path, tiny.built, name)


def test_a_slice_runs_its_variants_and_the_stages_they_start_from():
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.cut import load_slices, slice_experiment

    path = ROOT / "pipelines" / "replicate.yaml"
    experiment, slices = load_slices(path, load_pipeline(path))
    assert len(slices) == 9 and all(s["minutes"] <= 100 for s in slices.values())  # 3 kinds x 3 seeds
    sub = slice_experiment(path, experiment, slices["w1-readers-nomask-s2"])
    assert {v: s["stages"] for v, s in sub["variants"].items()} == {
        "main#s2": ["world", "index", "synthesize", "sft"],  # its cold start: no GRPO, no eval item left
        "reader_rag12#s2": COLD,
        "reader_gold#s2": COLD,
        "nomask#s2": ["world", "index", "synthesize", "sft", "rl", "eval"],
    }
    assert sub["variants"]["main#s2"]["set"] == ["synthesize.seed=2", "sft.seed=2"]
    assert list(sub["table"].values()) == ["reader_rag12#s2/rag", "reader_gold#s2/gold", "nomask#s2/rl"]
    assert "results" not in sub and "slices" not in sub


def test_the_cut_arms_run_in_slices_from_the_cold_starts_they_start_from():
    """replicate-extras.yaml: every cut arm at every seed in one slice of <= 100 min, each rebuilding
    only the cold start (or base LM) it reads, never the main arms' GRPO."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.cut import load_slices, slice_experiment

    path = ROOT / "pipelines" / "replicate-extras.yaml"
    experiment, slices = load_slices(path, load_pipeline(path))
    assert len(slices) == 21 and all(s["minutes"] <= 100 for s in slices.values())  # 7 kinds x 3 seeds
    reader = slice_experiment(path, experiment, slices["x-w2-reader-s1"])
    assert {v: s["stages"] for v, s in reader["variants"].items()} == {
        "fresh#s1": ["world", "index", "synthesize", "sft"],  # world seed 2's cold start, no GRPO
        "fresh_rag12#s1": COLD,
    }
    base = slice_experiment(path, experiment, slices["x-w1-base-s0"])
    assert "lora#s0" in base["variants"] and "base" in base["variants"]["lora#s0"]["stages"]
    assert "main#s0" not in base["variants"]  # GRPO from the base LM: no cold start at all
    assert list(base["table"].values()) == ["lora#s0/sft", "scratch#s0/rl"]
    cold = slice_experiment(path, experiment, slices["x-w1-cold-s2"])  # the arms' paired baseline, evaluated
    assert cold["variants"]["cold#s2"]["stages"] == COLD and list(cold["table"].values()) == ["cold#s2/sft"]


def test_the_ppo_arms_run_beside_the_grpo_arm_they_are_compared_with():
    """replicate-ppo.yaml: PPO and REINFORCE++ at every seed and world, each slice <= 100 min holding
    the cold start and GRPO arm its paired claims compare with, the same budget but no DAPO refills."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.cut import load_slices, slice_experiment

    path = ROOT / "pipelines" / "replicate-ppo.yaml"
    experiment, slices = load_slices(path, load_pipeline(path))
    assert len(slices) == 6 and all(s["minutes"] <= 100 for s in slices.values())  # 2 worlds x 3 seeds
    w1 = slice_experiment(path, experiment, slices["p-w1-s1"])
    assert set(w1["variants"]) == {"main#s1", "ppo#s1", "rpp#s1"}
    sets = {v: " ".join(spec.get("set") or []) for v, spec in w1["variants"].items()}
    assert "rl.algorithm=ppo" in sets["ppo#s1"] and "rl.dynamic_sampling=false" in sets["ppo#s1"]
    assert "rl.algorithm" not in sets["main#s1"]  # GRPO as replicate.yaml runs it
    w2 = slice_experiment(path, experiment, slices["p-w2-s0"])
    assert all("world.seed=2" in " ".join(spec.get("set") or []) for spec in w2["variants"].values())
    claims = [c["claim"] for c in load_pipeline(path)["compare"]]
    assert {"PPO beats GRPO (world seed 1)", "REINFORCE++ beats GRPO (world seed 1)"} <= set(claims)


def test_a_slice_file_holds_every_outcome_and_is_written_atomically(tiny, monkeypatch):
    rl_dir = tiny.built["main#s0"]["rl"].path
    rl_dir.mkdir(parents=True, exist_ok=True)
    (rl_dir / "metrics.jsonl").write_text('{"step": 1, "reward": 0.25}\n{"step": 2, "reward": 0.5, "dev/em": 0.4}\n')
    file = _write_slice(tiny.path, tiny.built, "grpo-s0")
    record = json.loads(file.read_text())
    # the training curve of each variant that ran RL: reward per step, dev EM where evaluated
    assert record["curves"] == {"main#s0": [{"step": 1, "reward": 0.25}, {"step": 2, "reward": 0.5, "dev_em": 0.4}]}
    assert file == Path("results/tiny/grpo-s0.json") and not list(file.parent.glob(".*part"))
    assert (record["slice"], record["slice_kind"], record["seed"], record["variants"]) == (
        "grpo-s0",
        "grpo-s{seed}",
        0,
        ["main#s0", "more#s0"],
    )
    rl = record["evals"]["main#s0"]["systems"]["rl"]
    assert len(rl["ids"]) == len(rl["em"]) == len(rl["f1"]) == 40 and rl["key"] == ["rl", "sft-s0", "rl-s0", "index-1"]
    assert set(record["runs"]) == {"main#s0/sft", "main#s0/rl", "more#s0/sft"}
    assert record["artifacts"]["more#s0"]["sft"] == "more-s0" and record["machine"]["cpu"] == "Stand-in EPYC"
    assert record["build_seconds"] == 30 * 5 + 600 * 2 + 1800  # every artifact once, as first built
    assert record["settings"]["more#s0"]["sft"]["lr"] == 1e-4 and len(record["settings_hash"]) == 16
    assert '"em": [' in file.read_text()  # a list of 40 values on one line, not 40 lines

    from r3rag.experiments.slices.file import write_slice

    def killed(fd):  # the process dies after writing, before the temp file is renamed into place
        raise KeyboardInterrupt

    before = file.read_text()
    monkeypatch.setattr("r3rag.experiments.results.file.os.fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        write_slice(file, {**record, "slice": "changed"})
    assert file.read_text() == before and not list(file.parent.glob(".*part"))  # the old file, whole


def test_merged_slices_equal_the_whole_runs_results(tiny, tmp_path):
    """The merge's rows (EM over seeds, intervals, dev EM found in another slice) and paired
    comparisons equal those of one run of the whole experiment over the same per-question outcomes."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.merge import merge

    whole = _whole_run(tiny.path, tiny.built, tmp_path)
    _all_slices(tiny)
    merged = json.loads(json.dumps(merge(tiny.path, load_pipeline(tiny.path))))
    assert merged["rows"] == whole["rows"] and merged["comparisons"] == whole["comparisons"]
    assert merged["tables"] == whole["tables"] and merged["date"] == "2026-12-03" and merged["reruns"] == []
    run = merged["rows"][1]["runs"][0]  # GRPO at seed 0: its dev eval is in slice rest-s0
    assert (run["variant"], run["dev_from"]) == ("main#s0", "dev#s0/rl")
    assert "Stand-in EPYC" in merged["machine"] and set(merged["slices"]) == {
        "grpo-s0",
        "grpo-s1",
        "rest-s0",
        "rest-s1",
    }

    out = r3rag_inprocess("report", "--results", "results/tiny.json")  # no docs block yet: merged, not an error
    assert out.returncode == 0, out.stderr
    assert (
        "merged from 4 slices" in out.stdout
        and json.loads(Path("results/tiny.json").read_text())["rows"] == whole["rows"]
    )


def _git(*args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True)


def test_status_lists_committed_written_stale_and_missing_slices_and_the_hours_left(tiny):
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.status.slices import slice_rows

    _git("init", "-q")
    committed = _write_slice(tiny.path, tiny.built, "grpo-s0")
    _git("add", str(committed))
    _git("commit", "-q", "-m", "slice")
    state = {r["slice"]: r for r in slice_rows(tiny.path, load_pipeline(tiny.path))}
    assert state["grpo-s1"]["minutes"] == pytest.approx(3150 / 60)  # as the committed grpo-s0 took, not 90
    assert state["rest-s1"]["minutes"] is None  # no estimate in the pipeline, none of its kind done
    _write_slice(tiny.path, tiny.built, "rest-s0")  # written, not committed
    state = {r["slice"]: r for r in slice_rows(tiny.path, load_pipeline(tiny.path))}
    assert {k: r["state"] for k, r in state.items()} == {
        "grpo-s0": "committed",
        "grpo-s1": "missing",
        "rest-s0": "written",
        "rest-s1": "missing",
    }
    assert state["rest-s1"]["minutes"] == pytest.approx(3180 / 60) and "not committed yet" in state["rest-s0"]["detail"]

    out = r3rag_inprocess("run", tiny.path, "--status")
    assert out.returncode == 0, out.stderr
    assert "1 committed, 1 written, 0 stale, 2 missing (of 4 slices); ~1.8 h of build left" in out.stdout
    assert f"| {GRPO} (1 of 2 seeds) |" in out.stdout and "Results so far, from the slice files" in out.stdout

    _pipeline(Path.cwd(), sft={"layers": 1, "hidden": 64})  # a new cold-start recipe: same slices, new ids
    state = {r["slice"]: r for r in slice_rows(tiny.path, load_pipeline(tiny.path))}
    assert state["grpo-s0"]["state"] == "stale" and "settings changed since: main#s0.sft" in state["grpo-s0"]["detail"]
    assert_one_line_error(
        r3rag_inprocess("report", "--results", "results/tiny.json"), "4 of 4 slices have no current file"
    )


@pytest.mark.parametrize(
    "damage, needles",
    [
        (lambda text: text[: len(text) // 2], ["results/tiny/rest-s0.json", "not a readable slice file"]),
        (lambda text: text.replace('"dev#s0"', '"ghost#s0"'), ["rest-s0.json", "names arm 'ghost#s0'", "dev#s0"]),
        (lambda text: text.replace('"slice": "rest-s0"', '"slice": "rest-s9"'), ["rest-s0.json", "'rest-s9'"]),
        (lambda text: text.replace('"kind": "r3rag slice"', '"kind": "x"'), ["rest-s0.json", "not a slice file"]),
    ],
    ids=["cut", "unknown-arm", "unknown-slice", "not-a-slice"],
)
def test_a_bad_slice_file_is_one_line_naming_it(tiny, damage, needles):
    _all_slices(tiny)
    file = Path("results/tiny/rest-s0.json")
    file.write_text(damage(file.read_text()))
    assert_one_line_error(r3rag_inprocess("report", "--results", "results/tiny.json"), *needles)
    assert_one_line_error(r3rag_inprocess("run", tiny.path, "--status"), *needles)


def test_a_slice_rerun_elsewhere_is_kept_beside_it_and_the_first_to_finish_counts(tiny):
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.file import target_file
    from r3rag.experiments.slices.merge import merge

    _all_slices(tiny)
    first = merge(tiny.path, load_pipeline(tiny.path))
    record = json.loads(Path("results/tiny/grpo-s0.json").read_text())
    assert target_file(Path("results/tiny"), "grpo-s0", record) is None  # the same artifacts: nothing to write
    other = json.loads(json.dumps(record))  # the same slice on another machine: GRPO not bit-identical
    other["artifacts"]["main#s0"]["rl"] = "rl-elsewhere"
    other["machine"]["cpu"] = "Other CPU"
    other["evals"]["main#s0"]["systems"]["rl"]["em"][0] = 1.0 - other["evals"]["main#s0"]["systems"]["rl"]["em"][0]
    rerun = target_file(Path("results/tiny"), "grpo-s0", other)
    assert rerun == Path("results/tiny/grpo-s0.rerun2.json")

    rerun.write_text(json.dumps({**other, "finished": "2026-12-04T09:00:00Z"}))  # finished later: kept aside
    merged = merge(tiny.path, load_pipeline(tiny.path))
    assert merged["rows"] == first["rows"] and merged["slices"]["grpo-s0"]["file"] == "results/tiny/grpo-s0.json"
    assert merged["artifact_differences"] == []  # the file kept and the other slices name the same GRPO
    (diff,) = merged["reruns"]
    assert diff["kept"] == "results/tiny/grpo-s0.json" and diff["other"] == str(rerun)
    assert diff["artifacts_differ"] == ["main#s0.rl"] and list(diff["outcomes_differ"]) == ["main#s0/rl"]
    assert diff["outcomes_differ"]["main#s0/rl"]["questions"] == 1 and "Other CPU" in diff["machines"][1]

    rerun.write_text(json.dumps({**other, "finished": "2026-12-02T09:00:00Z"}))  # finished first: it counts
    merged = merge(tiny.path, load_pipeline(tiny.path))
    assert merged["slices"]["grpo-s0"]["file"] == str(rerun) and merged["reruns"][0]["other"].endswith("grpo-s0.json")
    assert merged["rows"] != first["rows"]
    # rest-s0's dev eval read the GRPO built with grpo-s0's first file: the same recipe, another id
    assert merged["artifact_differences"] == [
        {"artifact": "main#s0.rl", "ids": {"grpo-s0:main#s0.rl": "rl-elsewhere", "rest-s0:dev#s0.rl": "rl-s0"}}
    ]


def test_run_slice_writes_its_file_and_prints_how_to_commit_it(tiny, monkeypatch):
    """`r3rag run FILE --slice NAME`, its building stood in for: the file, then the git line."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.cut import check_overrides, load_slices, slice_experiment

    def build(path, sub, overrides, runs_dir):
        built = {v: {st: tiny.built[v][st] for st in spec["stages"]} for v, spec in sub["variants"].items()}
        return built, SimpleNamespace(id="table-1", path=Path("runs/table/t"))

    monkeypatch.setattr("r3rag.experiments.experiment.build_experiment", build)
    out = r3rag_inprocess("run", tiny.path, "--slice", "rest-s1")
    assert out.returncode == 0, out.stderr
    assert "wrote results/tiny/rest-s1.json" in out.stdout
    assert "git add -- results/tiny/rest-s1.json && git commit -m" in out.stdout
    assert json.loads(Path("results/tiny/rest-s1.json").read_text())["variants"] == ["dev#s1", "reader#s1"]
    again = r3rag_inprocess("run", tiny.path, "--slice", "rest-s1")
    assert "already records these artifacts; nothing written" in again.stdout

    assert_one_line_error(r3rag_inprocess("run", tiny.path, "--slice", "nope"), "no such slice", "grpo-s0")
    bad = r3rag_inprocess("run", tiny.path, "--slice", "rest-s1", "--set", "sft.lr=0.5")
    assert_one_line_error(bad, "changes what the slice builds")
    assert_one_line_error(r3rag_inprocess("run", tiny.path, "--commit"), "--commit", "--slice")
    experiment, slices = load_slices(tiny.path, load_pipeline(tiny.path))
    sub = slice_experiment(tiny.path, experiment, slices["rest-s1"])
    assert check_overrides(tiny.path, sub, slices["rest-s1"], ["eval.threads=1"])  # how it runs: allowed


ALL = ["main", "more", "dev", "reader"]


@pytest.mark.parametrize(
    "changes, needles",
    [
        (
            {"slices": {"a-s{seed}": {"variants": ALL}, "b-s{seed}": {"variants": ["main"]}}},
            ["main#s0 is in both a-s0 and b-s0"],
        ),
        ({"slices": {"a-s{seed}": {"variants": ALL[:3]}}}, ["the table's reader#s0 is in no slice"]),
        ({"slices": {"a-s{seed}": {"variants": ["ghost"]}}}, ["slices.a-s{seed}", "'ghost'"]),
        ({"slices": {"a.b-s{seed}": {"variants": ALL}}}, ["'a.b-s0'", "letters, digits"]),
        ({"slices": {"a-s{seed}": {"variants": ALL, "minutes": -1}}}, ["minutes", "positive"]),
        ({"seeds": None, "slices": {"a-s{seed}": {"variants": ALL}}}, ["`{seed}`", "needs a `seeds` section"]),
        ({"results": None}, ["slices", "needs `results:`"]),
    ],
)
def test_bad_slices_sections_fail_before_anything_runs(tmp_path, changes, needles):
    out = r3rag_inprocess("run", _pipeline(tmp_path, **changes), "--dry-run", "--runs-dir", tmp_path / "runs")
    assert_one_line_error(out, *needles)


def test_committed_results_files_are_the_merge_of_their_committed_slices(monkeypatch):
    """A results file with a folder of slice files beside it is what `r3rag report --results` merges from
    them; a folder whose slices are not all in has no results file yet (the merge refuses)."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.slices.merge import merge

    monkeypatch.chdir(ROOT)  # slice files name their pipeline and folder from the repository's root
    folders = [d for d in sorted((ROOT / "results").glob("*")) if d.is_dir() and list(d.glob("*.json"))]
    if not folders:
        pytest.skip("no slice files committed yet")
    for folder in folders:
        record = json.loads(next(folder.glob("*.json")).read_text())
        pipeline = Path(record["pipeline"])
        if not folder.with_suffix(".json").exists():  # slices still missing: nothing merged to commit yet
            with pytest.raises(UserError, match="have no current file"):
                merge(pipeline, load_pipeline(pipeline))
            continue
        committed = json.loads(folder.with_suffix(".json").read_text())
        merged = json.loads(json.dumps(merge(pipeline, load_pipeline(pipeline)), default=str))
        assert merged["rows"] == committed["rows"] and merged["comparisons"] == committed["comparisons"], folder


def test_merged_slices_carry_each_rl_runs_curve_and_its_stability_block(tiny, tmp_path):
    """Slices whose RL runs logged a curve: the merge keeps each row's curve per seed and their
    largest drops; a `stability` docs block renders them and draws every run's curve."""
    from r3rag.experiments.pipeline import load_pipeline
    from r3rag.experiments.results.docs import update_docs
    from r3rag.experiments.slices.merge import merge

    for seed, dip in ((0, 0.3), (1, 0.0)):
        rl = tiny.built[f"main#s{seed}"]["rl"].path
        rl.mkdir(parents=True, exist_ok=True)
        rows = [
            {"step": 1, "reward": 0.5, "dev/em": 0.6},
            {"step": 2, "reward": 0.5 - dip},
            {"step": 3, "reward": 0.6, "dev/em": 0.6 - dip},
        ]
        (rl / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _all_slices(tiny)
    merged = merge(tiny.path, load_pipeline(tiny.path))
    label = GRPO  # an RL row: its curve at both seeds (no curve for the SFT rows)
    assert SFT not in merged["curves"] and set(merged["curves"][label]) == {"0", "1"}
    assert merged["stability"][label]["0"]["dev_em_drop"] == pytest.approx(0.3)
    assert merged["stability"][label]["1"]["dev_em_drop"] == 0.0
    Path("results/tiny.json").write_text(json.dumps(merged, default=str))
    doc = Path("doc.md")
    doc.write_text("<!-- r3rag:results results/tiny.json stability chart=curves.png -->\n<!-- /r3rag:results -->\n")
    update_docs([doc], Path("."), results=[Path("results/tiny.json")])
    text = doc.read_text()
    assert f"| {label} | 0 |" in text and "| 0.300 |" in text
    png = Path("curves.png")
    assert not png.exists() or png.read_bytes()[:4] == b"\x89PNG"
