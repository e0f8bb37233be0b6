"""The compiled kernels one simulated serve calls: their share, their time per call, and a
candidate build against the installed one on the very same calls.

Serves one cell as ``bench_sim.py`` does (qwen3-8b on h100-sxm, ``math`` workload, closed loop,
the memory plan on; 8 requests at C = 1, else 2·C) with every function of the compiled module
``bastion._bestfirst`` wrapped to record its calls (arguments copied), then replays each
kernel's recorded calls ``--repeats`` times and reports the median µs per call, the calls per
serve and their share of the serve's CPU time.

A replayed call reads copies of its arguments: a kernel whose arguments are large shared state
replays with colder caches than in the serve. ``draws`` (the synthetic drafter: every call
reads the whole store of drawn blocks, a megabyte at C = 32) is therefore left out unless named
in ``--kernels``, and its figures then overstate it.

``--against PATH``: a second build of the extension (a ``_bestfirst*.so`` built from another
checkout, e.g. a candidate change to one kernel). Each recorded call is first run by both and
their outputs must be identical (a kernel must stay bit-identical; the script stops at the
first difference, naming the kernel and the call); then both are timed alternately, round by
round, and the ratio of their medians is reported (candidate / installed).

Run: ``python benchmarks/bench_kernels.py [--cell 32:bastion:paper] [--repeats 15]
[--kernels paper,joint,...] [--against PATH]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from bench_sim import Cells  # its sibling (run as a script, its folder is on the path)

from bastion import _bestfirst as kernel_module  # type: ignore[attr-defined]
from bastion.errors import BastionError
from bastion.policies import make_policy

# module globals that hold a kernel function bound at import (the rest call it by attribute)
BOUND = {"bastion.sim.synthetic": ("_draws", "draws"), "bastion.budget": ("_chunk", "chunk")}


def parse_cell(text: str) -> tuple[int, str]:
    """``C:policy`` → (C, policy); C a whole number ≥ 1."""
    head, _, policy = text.partition(":")
    if not head.isdigit() or int(head) < 1 or not policy:
        raise SystemExit(
            f"--cell must be C:policy with C ≥ 1 (e.g. 32:bastion:paper); got {text!r}"
        )
    try:
        make_policy(policy)
    except BastionError as exc:  # an unknown or malformed policy: the registry's message
        raise SystemExit(f"--cell: {exc}") from None
    return int(head), policy


def load_build(path: str) -> ModuleType:
    """The extension at ``path`` as a module of its own (its init symbol is _bestfirst's)."""
    file = Path(path)
    if not file.is_file() or "_bestfirst" not in file.name or file.suffix not in (".so", ".pyd"):
        raise SystemExit(f"--against must be a built _bestfirst extension file; got {path!r}")
    spec = importlib.util.spec_from_file_location("candidate._bestfirst", file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against: cannot load {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_serve(concurrency: int, policy_name: str) -> tuple[dict[str, list[tuple]], float]:
    """Serve the cell once with every kernel call recorded; (calls per kernel, serve CPU s)."""
    cells = Cells()  # bench_sim's cells: qwen3-8b, h100-sxm, math, memory on

    def run_once() -> float:
        return cells.serve(policy_name, concurrency)[2]

    run_once()  # warm: the prior's anchors, caches of the cost model
    cpu = statistics.median(run_once() for _ in range(3))  # the serve unrecorded
    calls: dict[str, list[tuple]] = {}
    originals: dict[str, Callable[..., Any]] = {}

    def recorder(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            copied = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
            out = fn(*args)
            calls.setdefault(name, []).append(copied)
            return out

        return wrapped

    for name in dir(kernel_module):
        fn = getattr(kernel_module, name)
        if callable(fn) and not name.startswith("_"):
            originals[name] = fn
            setattr(kernel_module, name, recorder(name, fn))
    bound = {m: getattr(sys.modules[m], g) for m, (g, _) in BOUND.items() if m in sys.modules}
    for m, (attr, name) in BOUND.items():
        if m in sys.modules and bound[m] is not None:
            setattr(sys.modules[m], attr, getattr(kernel_module, name))
    try:
        run_once()
    finally:
        for name, fn in originals.items():
            setattr(kernel_module, name, fn)
        for m, fn in bound.items():
            setattr(sys.modules[m], BOUND[m][0], fn)
    return calls, cpu


def replay(fn: Callable[..., Any], calls: list[tuple]) -> float:
    start = time.perf_counter()
    for args in calls:
        fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cell", default="32:bastion:paper", help="C:policy (default 32:bastion:paper)"
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--kernels", default="", help="comma-separated kernel names (default: all called)"
    )
    parser.add_argument("--against", default=None, help="another build of bastion._bestfirst (.so)")
    args = parser.parse_args()
    if not 1 <= args.repeats <= 1000:
        raise SystemExit(f"--repeats must be 1 … 1000; got {args.repeats}")
    concurrency, policy = parse_cell(args.cell)
    other = load_build(args.against) if args.against else None
    calls, cpu = record_serve(concurrency, policy)
    wanted = [k for k in args.kernels.split(",") if k] or sorted(set(calls) - {"draws"})
    unknown = [k for k in wanted if not callable(getattr(kernel_module, k, None))]
    if unknown:
        raise SystemExit(f"--kernels: no such kernel {', '.join(unknown)}")
    print(f"# bench_kernels — C = {concurrency}, {policy}: a serve takes {cpu * 1e3:.1f} ms of CPU")
    if "draws" in wanted:
        print("# (draws replays with cold caches: its figures overstate it, see the docstring)")
    print()
    head = "| kernel | calls / serve | µs / call | share of the serve |"
    rule = "|---|---:|---:|---:|"
    if other is not None:
        head += " candidate µs / call | candidate / installed |"
        rule += "---:|---:|"
    print(head)
    print(rule)
    for name in wanted:
        recorded = calls.get(name, [])
        if not recorded:
            print(f"| {name} | 0 | — | — |" + (" — | — |" if other is not None else ""))
            continue
        mine = getattr(kernel_module, name)
        theirs = getattr(other, name, None) if other is not None else None
        if other is not None:
            if theirs is None:
                raise SystemExit(f"the candidate build has no kernel {name!r}")
            try:
                for i, a in enumerate(recorded):
                    if repr(mine(*a)) != repr(theirs(*a)):
                        raise SystemExit(f"{name}: the candidate's output differs at call {i}")
            except (TypeError, ValueError) as exc:  # another signature: nothing to compare
                print(f"| {name} | {len(recorded)} | … | … | not comparable: {exc} | — |")
                theirs = None
        t_mine, t_theirs = [], []
        for _ in range(args.repeats):
            t_mine.append(replay(mine, recorded))
            if theirs is not None:
                t_theirs.append(replay(theirs, recorded))
        per = statistics.median(t_mine) / len(recorded)
        row = f"| {name} | {len(recorded)} | {per * 1e6:.1f} | {per * len(recorded) / cpu:.1%} |"
        if theirs is not None:
            cand = statistics.median(t_theirs) / len(recorded)
            row += f" {cand * 1e6:.1f} | {cand / per:.3f} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
