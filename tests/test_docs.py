"""The Python examples in README.md and docs/*.md run as written.

A block fenced as ```` ```python notest ```` is illustrative (it needs a checkpoint or a GPU)
and is skipped; every plain ```` ```python ```` block must run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    pytest.param(block, id=f"{path.name}:{i}")
    for path in DOCS
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("code", BLOCKS)
def test_doc_example_runs(code: str) -> None:
    exec(compile(code, "<doc>", "exec"), {})
