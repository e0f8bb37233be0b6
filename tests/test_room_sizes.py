"""No room grows past what a reader can hold: every Python module of the package and the
simulator ≤ 600 lines, every class ≤ 300 lines, every C source ≤ 800 lines.

A room that outgrows these is split along the concepts it holds (docs/design.md has the map).
The checker itself is tested on planted oversize sources (its negative control).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE_LINES, CLASS_LINES, C_LINES = 600, 300, 800


def oversize(path: Path, text: str) -> list[str]:
    """What in one source breaks the limits, as 'path: what (lines)'."""
    lines = len(text.splitlines())
    if path.suffix == ".c":
        return [f"{path}: {lines} lines > {C_LINES}"] if lines > C_LINES else []
    found = [f"{path}: {lines} lines > {MODULE_LINES}"] if lines > MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > CLASS_LINES:
                found.append(f"{path}: class {node.name} {size} lines > {CLASS_LINES}")
    return found


def _sources() -> list[Path]:
    found = [*(ROOT / "bastion").rglob("*.py"), *(ROOT / "sim").rglob("*.py")]
    found += (ROOT / "bastion").rglob("*.c")
    # bastion/sim links to sim/: count each file once
    return sorted({p.resolve() for p in found})


def test_every_room_is_within_the_limits() -> None:
    sources = _sources()
    assert len(sources) > 50  # the walk found the package
    problems = [msg for p in sources for msg in oversize(p.relative_to(ROOT), p.read_text())]
    assert not problems, "split along its concepts:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("big.py", "x = 1\n" * (MODULE_LINES + 1), 1),
        ("ok.py", "x = 1\n" * MODULE_LINES, 0),
        ("cls.py", "class A:\n" + "    x = 1\n" * CLASS_LINES, 1),
        ("cls_ok.py", "class A:\n" + "    x = 1\n" * (CLASS_LINES - 1), 0),
        ("k.c", "int x;\n" * (C_LINES + 1), 1),
    ],
)
def test_the_checker_sees_a_planted_oversize_room(name: str, text: str, expected: int) -> None:
    assert len(oversize(Path(name), text)) == expected
