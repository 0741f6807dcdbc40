"""README stays short and its links resolve; every page in docs/ is in mkdocs.yml's nav; the site
builds with `mkdocs build --strict` (where mkdocs is installed: CI runs the same command)."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = [t for t in re.findall(r"\]\(([^)#\s]+)", text) if not t.startswith(("http://", "https://"))]
    assert any(t.startswith("docs/") for t in links) and "benchmarks/RESULTS.md" in links
    for target in links:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="LOUD SKIP: mkdocs and mkdocs-material are not installed (pip install mkdocs mkdocs-material)",
)
def test_docs_build_strict(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "cli" / "index.html").is_file()
