"""Per simulated step: what each policy's serve costs, what ``--target``× real time allows, and
where a step's time goes.

Serves each cell as ``bench_sim.py`` does (qwen3-8b on h100-sxm, ``math`` workload, closed
loop, memory plan on; 8 requests at C = 1, else 2·C) ``--repeats`` times and reports per
(C, policy): the serve's decode steps, its CPU µs per step (median over the repeats), the µs per
step that ``--target`` simulated seconds per CPU second would allow, and the step's excess over
the chain policy's at the same C — the chain's step is the simulator's own with a trivial
policy, so the excess is about what the policy's choice and learning add (the trees also change
what the simulator's part costs).

``--parts`` adds, per cell, the inclusive CPU µs per step of the step's parts, from a second
set of serves whose parts are wrapped in timers (each wrapped call adds ≈ 0.3 µs, so these
serves run slower than the first): the policy's choice, the drafter, the verifier, the report to
a learning policy, the simulated GPU's pricing of the step, and the rest (the server loop, KV
bookkeeping, the event queue).

Run: ``python benchmarks/bench_step_budget.py [--concurrency 1,32]
[--policies chain,bastion:paper,bastion:per-request,bastion] [--repeats 7] [--target 100]
[--parts]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench_sim import Cells, requests_at  # its sibling (run as a script, its folder is on the path)

from bastion.engine import SpecEngine
from bastion.errors import BastionError
from bastion.policies import make_policy
from bastion.sim.backend import SimBatch
from bastion.sim.gpu import SimulatedGPU

BASELINE = "chain"
# (what is timed, the class and method that does it)
PARTS: tuple[tuple[str, type, str], ...] = (
    ("draft", SimBatch, "draft_batch"),
    ("verify", SimBatch, "verify_batch"),
    ("report", SpecEngine, "report"),
    ("GPU pricing", SimulatedGPU, "step_s"),
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--policies", default="chain,bastion:paper,bastion:per-request,bastion")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target", type=float, default=100.0)
    parser.add_argument("--parts", action="store_true", help="time the step's parts too")
    args = parser.parse_args()
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise SystemExit(
            f"--concurrency must be whole numbers, e.g. 1,32; got {args.concurrency!r}"
        ) from None
    if not args.concurrency or min(args.concurrency) < 1:
        raise SystemExit("--concurrency: every C must be ≥ 1")
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be ≥ 1; got {args.repeats}")
    if not args.target > 0:
        raise SystemExit(f"--target must be > 0; got {args.target}")
    args.policies = [p for p in args.policies.split(",") if p]
    for name in args.policies:
        try:
            make_policy(name)
        except BastionError as exc:  # an unknown or malformed policy: the registry's message
            raise SystemExit(f"--policies: {exc}") from None
    return args


@contextmanager
def timed_parts(spent: dict[str, float]) -> Iterator[None]:
    """Wrap the step's parts (and every policy's ``choose_batch``, through the engine) in
    timers adding their CPU seconds to ``spent``; restored on exit."""

    def timer(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - start

        return wrapped

    saved = [(cls, name, cls.__dict__[name]) for _, cls, name in PARTS]
    saved_post = SpecEngine.__dict__["__post_init__"]

    def post_init(engine: SpecEngine) -> None:
        saved_post(engine)
        policy = engine._policy  # the batched policy the engine calls
        choose = timer("choice", policy.choose_batch)
        engine._policy = _Timed(policy, choose)

    try:
        for label, cls, name in PARTS:
            setattr(cls, name, timer(label, cls.__dict__[name]))
        SpecEngine.__post_init__ = post_init  # type: ignore[method-assign,assignment]
        yield
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
        SpecEngine.__post_init__ = saved_post  # type: ignore[method-assign]


class _Timed:
    """A batched policy whose ``choose_batch`` is timed; everything else is the policy's."""

    def __init__(self, policy: Any, choose: Callable[..., Any]) -> None:
        self._inner, self.choose_batch = policy, choose

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def main() -> None:
    args = parse_args()
    cells = Cells()
    print(
        f"# bench_step_budget — qwen3-8b · h100-sxm · math, memory on; {args.repeats} serves a "
        f"cell, CPU time; the budget for {args.target:g}× real time\n"
    )
    head = "| C | policy | requests | steps | µs a step | µs a step for the target | over chain |"
    if args.parts:
        head += " choice | draft | verify | report | GPU pricing | rest |"
    print(head)
    print("|---:|---|---:|---:|---:|---:|---:|" + ("---:|" * 6 if args.parts else ""))
    for c in args.concurrency:
        names = [BASELINE] + [p for p in args.policies if p != BASELINE]
        base = None
        for name in names:
            cpus, steps, sim_s = [], 0, 0.0
            for _ in range(args.repeats):
                r, _, cpu = cells.serve(name, c)
                cpus.append(cpu)
                steps, sim_s = r.steps, r.elapsed_s
            per_step = statistics.median(cpus) / steps * 1e6
            if name == BASELINE:
                base = per_step
            if name not in args.policies:
                continue
            budget = sim_s / args.target / steps * 1e6
            over = "" if name == BASELINE or base is None else f"{per_step - base:+.0f}"
            row = (
                f"| {c} | {name} | {requests_at(c)} | {steps} | {per_step:.0f} | {budget:.0f} "
                f"| {over} |"
            )
            if args.parts:
                spent: dict[str, float] = {}
                total = 0.0
                with timed_parts(spent):
                    for _ in range(args.repeats):
                        _, _, cpu = cells.serve(name, c)
                        total += cpu
                us = {k: v / args.repeats / steps * 1e6 for k, v in spent.items()}
                rest = total / args.repeats / steps * 1e6 - sum(us.values())
                row += "".join(
                    f" {us.get(k, 0.0):.0f} |"
                    for k in ("choice", "draft", "verify", "report", "GPU pricing")
                )
                row += f" {rest:.0f} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
