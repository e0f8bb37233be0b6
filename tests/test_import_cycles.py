"""No import circles in bastion/ and sim/ (as bastion.sim): every module's imports, read by ast.

What counts as an import: every ``import`` / ``from … import`` statement anywhere in a module —
at the top, inside a function (a lazy import), or under ``if TYPE_CHECKING:``. A lazy import
only postpones a circle to the first call and a TYPE_CHECKING one still ties the two modules'
definitions together, so both count (the two circles issue 19 found were one of each). Importing
``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so it is an edge to those packages too,
except to the importer's own parent packages (Python has run them already). Imports of names
that are not modules of the tree (the compiled ``bastion._bestfirst``, third-party packages)
and ``importlib`` calls are not edges.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = (("bastion", "bastion"), ("sim", "bastion.sim"))  # (directory, package it imports as)

# Circles known and accepted for now, each with its way out. The test fails when a circle is
# added *or* when one listed here is gone (then delete its entry), so the list stays true.
KNOWN: dict[frozenset[str], str] = {}  # cycles tolerated for now, each with its fix


def module_files(trees: Iterable[tuple[Path, str]]) -> dict[str, Path]:
    """Every .py file under each directory, by the dotted name it is imported as."""
    out: dict[str, Path] = {}
    for directory, package in trees:
        for f in sorted(directory.rglob("*.py")):
            rel = f.relative_to(directory).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            if package == "bastion" and rel[:1] == ("sim",):
                continue  # bastion/sim links to sim/: read once, as bastion.sim
            out[".".join((package, *rel))] = f
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ``modules`` it imports (see the module docstring)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = {name, *_ancestors(name)}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = parts[: len(parts) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:  # `from pkg import mod` imports the module pkg.mod
                    sub = f"{module}.{alias.name}"
                    targets.append(sub if sub in modules else module)
        edges = graph.setdefault(name, set())
        for target in targets:
            while target and target not in modules:  # `import a.b.name`: the module a.b
                target = target.rpartition(".")[0]
            if not target:
                continue  # not a module of the tree
            edges.update(t for t in (target, *_ancestors(target)) if t in modules and t not in own)
    return graph


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    nodes = sorted({*graph, *(t for ts in graph.values() for t in ts)})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.add(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(frozenset(component))
    return out


def _describe(cycle: frozenset[str], graph: Mapping[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(cycle) for b in sorted(graph[a] & cycle)]
    return "{" + ", ".join(sorted(cycle)) + "}: " + "; ".join(edges)


def test_no_import_cycles_in_bastion_and_sim() -> None:
    modules = module_files((ROOT / d, p) for d, p in TREES)
    assert "bastion.sim.experiments.config" in modules and "bastion.interfaces" in modules
    graph = import_graph(modules)
    cycles = set(find_cycles(graph))
    new = [_describe(c, graph) for c in cycles - set(KNOWN)]
    assert not new, "import cycles:\n" + "\n".join(new)
    gone = [sorted(c) for c in set(KNOWN) - cycles]
    assert not gone, f"no longer a cycle, delete from KNOWN: {gone}"


def test_cycle_finder_finds_a_synthetic_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set()}
    assert find_cycles(graph) == [frozenset({"a", "b", "c"})]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert sorted(map(sorted, find_cycles({"x": {"y"}, "y": {"x"}, "p": {"q"}, "q": {"p"}}))) == [
        ["p", "q"],
        ["x", "y"],
    ]


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize(
    ("x", "y"),
    [
        ("from pkg.y import f\n", "from pkg import x\n"),  # top level, both ways
        ("def g():\n    from .y import f\n", "import pkg.x\n"),  # lazy and relative
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.y import f\n",
            "from pkg.x import g\n",
        ),
        ("from pkg.sub.z import h\n", "from pkg import x\n"),  # via the package sub/__init__
    ],
)
def test_cycle_finder_reads_a_package_on_disk(tmp_path: Path, x: str, y: str) -> None:
    root = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "x.py": x,
            "y.py": y + "def f():\n    pass\n",
            "sub/__init__.py": "from pkg.y import f\n" if "sub" in x else "",
            "sub/z.py": "def h():\n    pass\n",
        },
    )
    graph = import_graph(module_files([(root, "pkg")]))
    assert any({"pkg.x", "pkg.y"} <= c for c in find_cycles(graph)), graph


def test_parent_packages_and_outside_names_are_not_cycles(tmp_path: Path) -> None:
    root = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "from pkg.a import f\nfrom pkg import _compiled\n",
            "a.py": "import numpy\nfrom pkg import _compiled\nimport pkg\n\ndef f():\n    pass\n",
            "b.py": "from pkg.a import f\n",
        },
    )
    graph = import_graph(module_files([(root, "pkg")]))
    assert graph["pkg.b"] == {"pkg.a"}  # not pkg: b's own parent package
    assert graph["pkg.a"] == set()
    assert find_cycles(graph) == []
