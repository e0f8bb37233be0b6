"""The Python examples in README.md and docs/*.md run as written.

A block fenced as ```` ```python notest ```` is illustrative (it needs a checkpoint or a GPU)
and is skipped; every plain ```` ```python ```` block must run. A page's blocks share one
namespace and run in order.
"""

from __future__ import annotations

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
