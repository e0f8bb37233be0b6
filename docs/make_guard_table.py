"""Rewrite the table of the guard's argument rules in docs/errors.md from the code.

    python docs/make_guard_table.py

The rows come from :func:`bastion.guard.rules_table` (every rule given to ``@public`` on a
public callable, the torch backend included when torch is installed); the text between the two
``guard-rules`` markers is replaced, atomically. A test checks the file matches the code.
"""

from __future__ import annotations

from pathlib import Path

from bastion.files import write_text_atomic
from bastion.guard import rules_table

DOC = Path(__file__).resolve().parent / "errors.md"
BEGIN, END = "<!-- guard-rules:begin -->\n", "<!-- guard-rules:end -->\n"


def rewritten(text: str, table: str) -> str:
    """``text`` with the rows between the markers replaced by ``table``."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + BEGIN + table + END + tail


if __name__ == "__main__":
    write_text_atomic(DOC, rewritten(DOC.read_text(encoding="utf-8"), rules_table()))
    print(f"wrote {DOC}")
