"""The Python examples in README.md and docs/*.md run as written.

A block fenced as ```` ```python notest ```` is illustrative (it needs a checkpoint or a GPU)
and is skipped; every plain ```` ```python ```` block must run. A page's blocks share one
namespace and run in order.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILES = [
    pytest.param(blocks, id=path.name)
    for path in DOCS
    if (blocks := re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("blocks", FILES)
def test_doc_examples_run(blocks: list[str]) -> None:
    """A page's blocks run in order in one namespace, as a reader would run them."""
    namespace: dict[str, object] = {}
    for i, code in enumerate(blocks):
        exec(compile(code, f"<python block {i}>", "exec"), namespace)


def _paper_claims():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_paper_claims", ROOT / "docs" / "make_paper_claims.py"
    )
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    return make, make.DOC.read_text(encoding="utf-8"), json.loads(make.OUT.read_text())


def test_the_paper_claims_page_reads_its_data() -> None:
    """Every number docs/paper-claims.md takes from docs/data/paper-claims.json (means, ranges,
    ratios of its runs) reads as the JSON gives it (``python docs/make_paper_claims.py
    --check`` says where it does not)."""
    make, page, data = _paper_claims()
    assert len(make.claims(data)) > 40  # the summary's and the notes' numbers, not a few
    assert make.drift(page, data) == []


def test_the_paper_claims_check_sees_a_drift() -> None:
    """Negative controls: a number of the page changed, or a number of the data, is drift."""
    make, page, data = _paper_claims()
    assert "| 5.66× / 5.63× (A100" in page
    moved = page.replace("| 5.66× / 5.63× (A100", "| 5.66× / 5.64× (A100")
    assert make.drift(moved, data) == [
        "'| Fig. 1: average speedup over AR |' should read '5.66× / 5.63×'"
    ]
    rerun = json.loads(json.dumps(data))
    rerun["moe"]["code"]["rows"]["chain"]["tau"] += 0.1  # 7.29 → 7.39
    assert any("τ 7.39" in problem for problem in make.drift(page, rerun))
    gone = page.replace("**T_aux.**", "**Host time.**")
    assert make.drift(gone, data) == ["0 rows or paragraphs hold '**T_aux.**' (need exactly one)"]
