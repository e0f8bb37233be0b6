"""Instructions per simulated step: the simulator's host work counted by valgrind, free of noise.

Serves ``bench_sim.py``'s cells (qwen3-8b on h100-sxm, ``math`` workload, closed loop, memory
plan on; 8 requests at C = 1, else 2·C) under valgrind's callgrind and counts the CPU
instructions executed inside the serving loop — the span ``bench_sim.py`` times, start-up and
the cell's set-up left out — per simulated decode step. On a shared 2-core machine a cell's
wall or CPU time moves by ±10 % from run to run; its instruction count repeats to about ±0.1 %,
so two versions of the code compare by one run each (``PYTHONPATH=other/checkout``). An
instruction is not a unit of time (a cache miss costs none; a C kernel's instructions are
cheaper than the interpreter's): a change that counts fewer instructions is confirmed in time
by ``bench_sim.py`` before it is reported as faster. The counts are diagnostics, not results.

``--function module:qualname`` counts only what runs inside that function during the loop
(inclusive; a nested call of it counted once) — e.g. ``bastion.engine:SpecEngine.report`` —
where the name is looked up in its module at run time (a name imported elsewhere with ``from
… import`` is a separate reference: rebind it with ``--rebind module[,module…]``).
``--annotate N`` prints the N functions (C level: the interpreter, numpy, the compiled kernels)
with the most instructions of each cell.

Needs valgrind and a C compiler (a small shim issues callgrind's client requests around the
loop); about 20 s a cell, most of it start-up under valgrind.

Run: ``python benchmarks/bench_instructions.py [--concurrency 32] [--policies bastion]
[--function MODULE:QUALNAME [--rebind MODULES]] [--annotate N]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SHIM = r"""
#include <valgrind/callgrind.h>
void loop_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void loop_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
void collect_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""
STEPS = "bench_instructions steps:"


class BenchError(Exception):
    """A bad argument or a missing tool (reported without a traceback)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="32", help="comma-separated C (default 32)")
    parser.add_argument("--policies", default="bastion", help="comma-separated policy names")
    parser.add_argument("--function", default="", help="count inside MODULE:QUALNAME only")
    parser.add_argument("--rebind", default="", help="modules that imported --function's name")
    parser.add_argument("--annotate", type=int, default=0, help="top N functions of each cell")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shim", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        parser.error(f"--concurrency must be comma-separated integers; got {args.concurrency!r}")
    if any(c < 1 for c in args.concurrency):
        parser.error("--concurrency values must be ≥ 1")
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not args.policies:
        parser.error("--policies names no policy")
    if args.function and not re.fullmatch(r"[\w.]+:[\w.]+", args.function):
        parser.error(f"--function must be MODULE:QUALNAME; got {args.function!r}")
    if args.rebind and not args.function:
        parser.error("--rebind needs --function")
    args.rebind = [m.strip() for m in args.rebind.split(",") if m.strip()]
    if args.annotate < 0:
        parser.error("--annotate must be ≥ 0")
    return args


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse unknown policies and an unresolvable --function before valgrind starts."""
    from bastion.errors import BastionError
    from bastion.policies import make_policy

    for name in args.policies:
        try:
            make_policy(name)
        except BastionError as exc:
            raise BenchError(f"--policies: {exc}") from None
    if args.function:
        resolve(args.function)
        for module in args.rebind:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise BenchError(f"--rebind: no module {module!r} ({exc})") from None


def resolve(target: str) -> tuple[Any, str]:
    """(the object holding ``target``'s function, its attribute name)."""
    module, _, qualname = target.partition(":")
    try:
        owner: Any = importlib.import_module(module)
    except ImportError as exc:
        raise BenchError(f"--function: no module {module!r} ({exc})") from None
    *path, name = qualname.split(".")
    try:
        for part in path:
            owner = getattr(owner, part)
        if not callable(getattr(owner, name)):
            raise BenchError(f"--function: {target} is not callable")
    except AttributeError:
        raise BenchError(f"--function: {module} has no {qualname}") from None
    return owner, name


def build_shim(folder: Path) -> Path:
    """The client-request shim, compiled into ``folder``."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise BenchError("no C compiler found (set CC): the shim cannot be built")
    source, library = folder / "shim.c", folder / "shim.so"
    source.write_text(SHIM)
    done = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise BenchError(f"the shim does not build (valgrind's headers?):\n{done.stderr}")
    return library


def child(args: argparse.Namespace) -> None:
    """Inside valgrind: one cell (one policy, one C), counted around its serving loop."""
    import bench_sim  # its sibling (run as a script, its folder is on the path)

    shim = ctypes.CDLL(args.shim)
    cells = bench_sim.Cells()
    policy, concurrency = args.policies[0], args.concurrency[0]
    cells.serve(policy, concurrency)  # warm: what later serves of the same cell find cached
    if args.function:
        owner, name = resolve(args.function)
        inner = getattr(owner, name)
        depth = [0]

        @functools.wraps(inner)
        def counted(*a: Any, **k: Any) -> Any:
            depth[0] += 1
            if depth[0] == 1:
                shim.collect_toggle()
            try:
                return inner(*a, **k)
            finally:
                if depth[0] == 1:
                    shim.collect_toggle()
                depth[0] -= 1

        setattr(owner, name, counted)
        for module in args.rebind:
            setattr(importlib.import_module(module), name.split(".")[-1], counted)
    serve = bench_sim.serve

    def loop(*a: Any, **k: Any) -> Any:
        shim.loop_start()
        try:
            return serve(*a, **k)
        finally:
            shim.loop_stop()

    bench_sim.serve = loop
    result, _, _ = cells.serve(policy, concurrency)
    print(STEPS, result.steps, flush=True)


def count(args: argparse.Namespace, policy: str, c: int, shim: Path, folder: Path) -> tuple:
    """(steps, instructions, the callgrind dump) of one cell, run under valgrind."""
    tag = re.sub(r"[^\w]+", "_", policy)
    out = folder / f"cg.{c}.{tag}"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--collect-atstart={'no' if args.function else 'yes'}",
        f"--callgrind-out-file={out}",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        f"--shim={shim}",
        f"--policies={policy}",
        f"--concurrency={c}",
    ]
    if args.function:
        command += [f"--function={args.function}", f"--rebind={','.join(args.rebind)}"]
    done = subprocess.run(command, capture_output=True, text=True)
    steps = [line for line in done.stdout.splitlines() if line.startswith(STEPS)]
    if done.returncode != 0 or not steps:
        raise BenchError(f"C = {c}, {policy}: the run under valgrind failed\n{done.stderr[-2000:]}")
    dumps = sorted(folder.glob(out.name + ".*"))  # the loop's dump (the rest counts nothing)
    total = 0
    for dump in [out, *dumps]:
        if dump.exists():
            for line in dump.read_text(errors="replace").splitlines():
                if line.startswith("totals:"):
                    total += int(line.split()[1])
    return int(steps[0].split()[-1]), total, dumps[-1] if dumps else out


def annotate(dump: Path, top: int) -> list[str]:
    """The ``top`` functions of a dump by instructions (callgrind_annotate's list)."""
    done = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", str(dump)], capture_output=True, text=True
    )
    rows = [line for line in done.stdout.splitlines() if re.match(r"\s*[\d,]+ \(", line)]
    return rows[1 : top + 1]  # (the first row is the program's total)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    try:
        if shutil.which("valgrind") is None:
            raise BenchError("valgrind is not installed (it counts the instructions)")
        check_inputs(args)
        what = f" inside {args.function}" if args.function else ""
        print(f"# bench_instructions — qwen3-8b · h100-sxm · math, memory on; callgrind{what}\n")
        print("| C | policy | steps | instructions a step |")
        print("|---:|---|---:|---:|")
        with tempfile.TemporaryDirectory(prefix="bench_instructions.") as tmp:
            folder = Path(tmp)
            shim = build_shim(folder)
            for c in args.concurrency:
                for policy in args.policies:
                    steps, total, dump = count(args, policy, c, shim, folder)
                    print(f"| {c} | {policy} | {steps} | {total / steps:,.0f} |", flush=True)
                    for row in annotate(dump, args.annotate) if args.annotate else ():
                        print("    " + row.strip())
    except BenchError as exc:
        print(f"bench_instructions: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
