"""Adaptive-controller benchmark at batch 1: µs per decode step, end to end.

Times ``AdaptivePolicy().choose(m, PolicyContext(StepLoad(ctx), cm, prev))`` — the cost-curve
lookups, the tree growth, the Ŝ scan and the returned ``DraftTree`` — on realistic inputs:

- marginals: ``bastion.sim.synthetic.SyntheticSource(get_workload(w), 0)``, ``--steps`` consecutive
  drafts of each of ``--requests`` requests, for w in math and chat;
- the cost model: ``bastion.sim.simulate.calibrated_cost_model`` of qwen3-8b (DFlash drafter) on a
  simulated h100-sxm (static calibration), a fresh copy per repeat, so its cache warms as in a
  real decode (a miss on the first step of each 64-token context bucket);
- contexts advancing like a real decode (prompt + 6 tokens per step) and the previous tree size
  passed as the engine does.

The baseline is a frozen copy, kept below, of the controller as it was before the fast path
(``choose_tree`` of commit 1a04c6f and ``RooflineCostModel.cost_curve``'s caching), run in the
same process on the same inputs, in whole decode passes alternating with the current code's
(which one goes first alternates per repeat); every step's tree and diagnostics are asserted
identical. Reported per mode: median µs per step, mean µs
(misses included), the median chosen N, the median ratio of the step's time to the predicted
verification time T_verify(N) of the chosen tree, and baseline median / current median.

Run: ``python benchmarks/bench_controller.py [--repeats 5]``. Never part of the tests.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import platform
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from bastion.bestfirst import COMPILED, best_first
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.errors import BudgetError, CostModelError
from bastion.interfaces import CostCurve, PolicyContext, StepLoad
from bastion.policies import AdaptivePolicy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.simulate import calibrated_cost_model
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload
from bastion.tree import DraftMarginals, tree_from_arrays

N_MAX = 1024
MODES = ("first-decrease", "auto")

# ------------------------------------------------------------------------------------------
# Baseline: the controller before the fast path (verbatim logic, commit 1a04c6f)
# ------------------------------------------------------------------------------------------


def _baseline_validate(curve: CostCurve, n_max: int) -> np.ndarray:
    verify = np.asarray(curve.verify_s, dtype=np.float64)
    if verify.ndim != 1 or verify.shape[0] < n_max:
        raise CostModelError("short curve")
    total = curve.draft_s + curve.prep_s + verify[:n_max]
    scalars = {"draft_s": curve.draft_s, "prep_s": curve.prep_s, "ar_step_s": curve.ar_step_s}
    for name, value in scalars.items():
        if not np.isfinite(value) or value < 0 or (name == "ar_step_s" and value <= 0):
            raise CostModelError(f"bad {name}")
    if not np.all(np.isfinite(total)) or np.any(total <= 0.0):
        bad = int(np.flatnonzero(~np.isfinite(total) | (total <= 0.0))[0]) + 1
        raise CostModelError(f"bad Ĉ({bad})")
    return total


def baseline_choose_tree(
    marginals: DraftMarginals,
    source: Callable[[int], CostCurve],
    n_max: int,
    mode: str,
    initial_budget: int,
    base_tokens: float = 0.0,
) -> tuple[Any, dict[str, Any]]:
    if not np.isfinite(base_tokens) or base_tokens < 0:
        raise BudgetError("base_tokens")
    if isinstance(n_max, bool) or not isinstance(n_max, (int, np.integer)) or n_max < 1:
        raise BudgetError("n_max")
    if mode not in ("first-decrease", "exhaustive", "auto"):
        raise BudgetError("mode")
    if initial_budget < 1:
        raise BudgetError("initial_budget")
    rule = "bounded" if mode == "auto" else mode
    a_ceiling = marginals.depth + 1.0
    budget = n_max if rule == "exhaustive" else min(initial_budget, n_max)
    while True:
        ahead = min(2 * budget, n_max) if rule == "bounded" else budget
        cc = source(ahead)
        c_all = _baseline_validate(cc, ahead)
        arrays = best_first(marginals.probs, budget)
        n = arrays[3].size
        exhausted = n < budget
        a_hat = np.cumsum(arrays[3])
        s_hat = (base_tokens + a_hat) * cc.ar_step_s / c_all[:n]
        done = exhausted or budget >= n_max
        if rule == "first-decrease":
            down = np.flatnonzero(s_hat[1:] < s_hat[:-1])
            stop = int(down[0]) + 1 if down.size else None
            if stop is not None or done:
                chosen = stop if stop is not None else n
                break
        else:
            chosen = int(np.argmax(s_hat)) + 1
            if done:
                break
            if not bool(np.all(np.diff(c_all) >= 0.0)):
                budget = min(2 * budget, n_max)
                continue
            rho, a_n = arrays[3][-1], a_hat[-1]
            near = np.arange(n + 1, ahead + 1)
            a_near = np.minimum(a_n + (near - n) * rho, a_ceiling)
            bound = float(np.max((base_tokens + a_near) / c_all[n:ahead], initial=0.0))
            a_far = min(a_n + (n_max - n) * rho, a_ceiling)
            bound = max(bound, (base_tokens + a_far) / c_all[ahead - 1]) * cc.ar_step_s
            if bound <= s_hat[chosen - 1]:
                break
        budget = min(2 * budget, n_max)
    diag = {
        "tree_size": chosen,
        "mode": rule,
        "a_hat": a_hat,
        "c_hat": c_all[:n],
        "s_hat": s_hat,
        "ar_step_s": float(cc.ar_step_s),
        "exhausted": exhausted,
        "capped": chosen == n == n_max,
    }
    tree = tree_from_arrays(tuple(a[:chosen] for a in arrays), marginals)  # type: ignore[arg-type]
    return tree, diag


class BaselineCurves:
    """``RooflineCostModel.cost_curve`` as it was: a cache keyed by (N, bucket, batch) holding
    the uncorrected arrays; every call re-corrects, re-checks and recomputes draft_s."""

    def __init__(self, cm: RooflineCostModel, cache_size: int = 256) -> None:
        self.cm = cm
        self.cache: OrderedDict[tuple[Any, ...], tuple[np.ndarray, ...]] = OrderedDict()
        self.cache_size = cache_size

    def __call__(self, max_tree_size: int, load: StepLoad) -> CostCurve:
        cm = self.cm
        if max_tree_size < 1:
            raise BudgetError("max_tree_size")
        key = (
            max_tree_size,
            cm.bucket(load.context_len),
            tuple((r.tree_size, cm.bucket(r.context_len)) for r in load.co_batched),
        )
        cached = self.cache.get(key)
        if cached is None:
            n = np.arange(1, max_tree_size + 1, dtype=np.float64)
            cached = (*cm._base(n, load), *cm._base(np.ones(1), load, masked=False))
            self.cache[key] = cached
            if len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        verify = cm._check(cm._correct(cached[0], cached[1]), "verify")
        ar = cm._check(cm._correct(cached[2], cached[3]), "L_AR")
        return CostCurve(
            draft_s=cm.draft_s(load), prep_s=cm.prep_s, verify_s=verify, ar_step_s=float(ar[0])
        )


def baseline_choose(
    mode: str, m: DraftMarginals, curves: BaselineCurves, load: StepLoad, prev: int | None
) -> tuple[Any, dict[str, Any]]:
    """``AdaptivePolicy(mode=mode).choose`` with the baseline controller and cost curve."""
    start = 128
    if prev:
        start = max(64, 2 * prev)
    return baseline_choose_tree(
        m, lambda n: curves(n, load), N_MAX, mode, start, base_tokens=load.co_batched_tokens
    )


# ------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------


def fresh_copy(cm: RooflineCostModel) -> RooflineCostModel:
    """An identical cost model with empty caches."""
    return RooflineCostModel(
        cm.hardware, cm.model, cm.drafter, calibration=cm.calibration, mode=cm.mode,
        options=cm.options, prep_s=cm.prep_s,
    )  # fmt: skip


def digest(tree: Any, diag: Any) -> str:
    """A fingerprint of a choice: every array's dtype and bytes, every scalar's repr."""
    h = hashlib.sha256()
    for f in ("parents", "tokens", "depths", "scores", "ranks"):
        a = getattr(tree, f)
        h.update(f"{f}:{a.dtype}:{a.shape}".encode() + a.tobytes())
    if isinstance(diag, dict):  # the baseline's
        fields = diag
    else:
        fields = {f: getattr(diag, f) for f in ("tree_size", "mode", "a_hat", "c_hat", "s_hat")}
        fields |= {f: getattr(diag, f) for f in ("ar_step_s", "exhausted", "capped")}
    for f, v in fields.items():
        if isinstance(v, np.ndarray):
            h.update(f"{f}:{v.dtype}:{v.shape}".encode() + v.tobytes())
        else:
            h.update(f"{f}:{type(v).__name__}:{v!r}".encode())
    return h.hexdigest()


def decode_pass(
    choose: Callable[[DraftMarginals, StepLoad, int | None], tuple[Any, Any]],
    drafts: list[list[DraftMarginals]],
    prompt_len: int,
) -> tuple[list[float], list[tuple[int, str]]]:
    """Every request decoded step by step (context + 6 per step, the previous tree size passed
    on); returns each step's seconds and (N, fingerprint of tree and diagnostics). The choices
    are dropped after fingerprinting, as a decode loop drops them."""
    times, out = [], []
    clock = time.perf_counter
    for steps in drafts:
        prev: int | None = None
        for step, m in enumerate(steps):
            load = StepLoad(prompt_len + 6 * step)
            a = clock()
            tree, diag = choose(m, load, prev)
            times.append(clock() - a)
            prev = tree.size
            out.append((prev, digest(tree, diag)))
            del tree, diag
    return times, out


def run(
    workload: str, cm0: RooflineCostModel, repeats: int, requests: int, steps: int
) -> list[dict[str, Any]]:
    wl = get_workload(workload)
    drafts = []
    for i in range(requests):
        source = SyntheticSource(wl, 0)
        source.admit(0, i)
        one = np.zeros(1, np.int64)
        drafts.append([source.draft(one, one)[0].row(0) for _ in range(steps)])
    rows = []
    for mode in MODES:
        policy = AdaptivePolicy(mode=mode)  # type: ignore[arg-type]
        t_new: list[float] = []
        t_old: list[float] = []
        for rep in range(repeats):
            cm = fresh_copy(cm0)  # fresh caches each repeat: misses as in a real decode
            old_curves = BaselineCurves(fresh_copy(cm0))

            def current(m: DraftMarginals, load: StepLoad, prev: int | None) -> tuple[Any, Any]:
                choice = policy.choose(m, PolicyContext(load, cm, prev))  # noqa: B023
                return choice.tree, choice.diagnostics

            def baseline(m: DraftMarginals, load: StepLoad, prev: int | None) -> tuple[Any, Any]:
                return baseline_choose(mode, m, old_curves, load, prev)  # noqa: B023

            # whole passes, alternating which goes first, so neither evicts the other's caches
            # step by step; the choices are compared afterwards
            if rep % 2 == 0:
                tn, new = decode_pass(current, drafts, wl.prompt_len)
                to, old = decode_pass(baseline, drafts, wl.prompt_len)
            else:
                to, old = decode_pass(baseline, drafts, wl.prompt_len)
                tn, new = decode_pass(current, drafts, wl.prompt_len)
            assert new == old, "the current controller chose differently from the baseline"
            t_new += tn
            t_old += to
        # the ratio to T_verify(N), priced by cm0 (never timed), for the chosen N of each step
        sizes = [n for n, _ in new]
        loads = [StepLoad(wl.prompt_len + 6 * s) for _ in drafts for s in range(len(drafts[0]))]
        t_verify = [
            float(cm0.cost_curve(N_MAX, load).verify_s[n - 1])
            for n, load in zip(sizes, loads, strict=True)
        ]
        of_verify = [t / tv for t, tv in zip(t_new, t_verify * repeats, strict=True)]
        med_new, med_old = statistics.median(t_new), statistics.median(t_old)
        rows.append(
            {
                "workload": workload,
                "mode": mode,
                "N": statistics.median(sizes),
                "us": med_new * 1e6,
                "mean_us": statistics.fmean(t_new) * 1e6,
                "base_us": med_old * 1e6,
                "base_mean_us": statistics.fmean(t_old) * 1e6,
                "of_verify": statistics.median(of_verify),
                "ratio": med_old / med_new,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    target = get_model("qwen3-8b")
    gpu = SimulatedGPU(get_profile("h100-sxm"), target, DrafterSpec.dflash_for(target))
    cm0, _ = calibrated_cost_model(gpu)
    print(f"# bench_controller — {platform.processor() or platform.machine()}, ", end="")
    print(f"Python {platform.python_version()}, numpy {np.__version__}")
    print(f"# compiled kernel: {'yes' if COMPILED else 'NO (pure-Python fallback)'}")
    print(
        f"# qwen3-8b + DFlash on simulated h100-sxm, static calibration; {args.requests} requests"
        f" × {args.steps} steps × {args.repeats} repeats per row; identical trees asserted\n"
    )
    print(
        "| workload | mode | median N | µs/step (median) | µs/step (mean) | % of T_verify(N) "
        "| baseline µs (median) | baseline µs (mean) | baseline / current |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    gc.disable()  # collections land at random steps and would dominate the means
    try:
        for w in ("math", "chat"):
            for r in run(w, cm0, args.repeats, args.requests, args.steps):
                print(
                    f"| {r['workload']} | {r['mode']} | {r['N']:.0f} | {r['us']:.1f} "
                    f"| {r['mean_us']:.1f} | {100 * r['of_verify']:.2f} % | {r['base_us']:.1f} "
                    f"| {r['base_mean_us']:.1f} | {r['ratio']:.2f}× |"
                )
    finally:
        gc.enable()


if __name__ == "__main__":
    main()
