"""Measuring and fitting workloads: τ(N) of a synthetic workload or of recorded traces, and a
workload fitted to dense traces.

τ here is acceptance only — committed tokens per step, bonus included, macro-averaged over
requests — for best-first trees of fixed size N (N = 1: target-only, τ = 1; ``"chain"``: the
DFlash single path of depth D). No time is simulated, so it is fast enough to fit with:

- :func:`synthetic_tau` draws R requests × S steps from :class:`sim.synthetic.SyntheticSource`
  and walks every tree against the target's tokens (the simulator's acceptance walk).
- :func:`replay_tau` walks recorded traces exactly as ``bastion simulate --trace`` does: each
  step's root is where the previous one's commit ended, its marginals are the dense
  recording's, its target tokens the recorded continuation.
- :func:`fit_traces` estimates a workload from dense traces (method of moments on every
  recorded root and position: head curve and alignment per depth, the variance components of
  the head log-odds by request, root and position, forks, the runner-up spread) and then
  refines three scale parameters by least squares on the traces' own τ(N) (replayed). It is the
  engine of ``bastion workload fit`` (docs/workloads.md reports its validation).

What this module does not do: draw streams (sim.synthetic), read trace files (sim.replay), or
simulate time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import optimize

from bastion.bestfirst import accepted_paths, best_first_flat
from bastion.errors import ConfigError
from bastion.guard import public
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import Workload
from bastion.trace import Trace

__all__ = [
    "FIT_SIZES",
    "TraceStats",
    "fit_traces",
    "replay_tau",
    "synthetic_tau",
    "trace_stats",
]

Size = int | str  # a tree size N (root included) or "chain"
FIT_SIZES: tuple[Size, ...] = ("chain", 16, 32, 64, 128, 256)


def _check_sizes(sizes: Sequence[Size]) -> None:
    for n in sizes:
        if n != "chain" and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"tree sizes are integers ≥ 1 or 'chain'; got {n!r}")


def _accepted(
    probs: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64] | None,
    target: npt.NDArray[np.int64],
    n: Size,
) -> npt.NDArray[np.int64]:
    """Accepted draft tokens per row of a best-first tree of size ``n`` (or the chain)."""
    depth = probs.shape[1]
    if n == "chain":
        probs, budget = np.ascontiguousarray(probs[:, :, :1]), depth + 1
    else:
        budget = int(n)
    if budget == 1:
        return np.zeros(probs.shape[0], np.int64)
    (parents, depths, ranks, _), offsets = best_first_flat(probs, budget)
    if ids is None:  # synthetic: token ids are the ranks
        tokens = ranks.copy()
    else:
        request = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
        tokens = ids[request, np.maximum(depths - 1, 0), np.maximum(ranks, 0)]
    tokens[offsets[:-1]] = -1
    walked = accepted_paths(parents, tokens, depths, offsets, target)
    if walked is not None:
        return walked[0]
    from bastion.batch import TreeBatch
    from bastion.sim.backend import accepted_counts_numpy

    scores = np.ones(parents.shape[0])
    batch = TreeBatch(offsets, parents, tokens, depths, scores, ranks)
    return accepted_counts_numpy(batch, target)[0]


@public
def synthetic_tau(
    workload: Workload,
    sizes: Sequence[Size] = FIT_SIZES,
    requests: int = 256,
    steps: int = 32,
    seed: int = 0,
    temperature: float = 0.0,
) -> dict[Size, float]:
    """τ at each size for ``requests`` synthetic requests of ``steps`` steps each (the same
    seed gives the same draws for any parameters: common random numbers)."""
    _check_sizes(sizes)
    if requests < 1 or steps < 1:
        raise ConfigError("synthetic_tau needs requests ≥ 1 and steps ≥ 1")
    src = SyntheticSource(workload, seed, temperature, block_steps=steps)
    slots = np.arange(requests, dtype=np.int64)
    src.reserve(requests)
    for s in slots.tolist():
        src.admit(s, s)
    totals = {n: np.zeros(requests) for n in sizes}
    for _ in range(steps):
        m, target = src.draft(slots, slots)
        probs = np.ascontiguousarray(m.probs)
        for n in sizes:
            totals[n] += _accepted(probs, None, target, n) + 1
    return {n: float(np.mean(t / steps)) for n, t in totals.items()}


def _sequence(trace: Trace) -> npt.NDArray[np.int64]:
    return np.array((*trace.prompt_ids, *trace.output_ids), dtype=np.int64)


@public
def replay_tau(traces: Sequence[Trace], sizes: Sequence[Size] = FIT_SIZES) -> dict[Size, float]:
    """τ at each size replayed on dense traces (T = 0: exact), macro-averaged over traces.

    Each request starts at its first output token, commits accepted + 1 tokens per step and
    stops at its recorded output length, its last step counting only the tokens still wanted
    — as in ``bastion simulate --trace``."""
    _check_sizes(sizes)
    if not traces:
        raise ConfigError("replay_tau needs at least one trace")
    result: dict[Size, float] = {}
    for n in sizes:
        per_trace = []
        for t in traces:
            seq, out, prompt = _sequence(t), len(t.output_ids), len(t.prompt_ids)
            marginals = {**t.dense, **{s.position: s.marginals for s in t.steps}}
            root, generated, committed = prompt, 1, []
            while generated < out:
                m = marginals.get(root)
                if m is None:
                    raise ConfigError(
                        f"trace of prompt {t.metadata.get('prompt_id', '?')}: no marginals at "
                        f"position {root}; fitting and replay need dense traces (--dense-trace)"
                    )
                depth = m.probs.shape[0]
                target = np.full((1, depth + 1), -1, np.int64)
                cont = seq[root + 1 : root + 2 + depth]
                target[0, : cont.shape[0]] = cont
                c = int(_accepted(m.probs[None], m.token_ids[None], target, n)[0]) + 1
                committed.append(min(c, out - generated))  # delivered tokens only
                root += c
                generated += c
            if committed:
                per_trace.append(float(np.mean(committed)))
        result[n] = float(np.mean(per_trace)) if per_trace else 1.0
    return result


# -- statistics of dense traces ------------------------------------------------------------------


@dataclass(frozen=True)
class TraceStats:
    """Every recorded (root, position) row of a set of dense traces, as flat arrays."""

    probs: npt.NDArray[np.float64]  # [R, K] the drafter's row, descending
    rank: npt.NDArray[np.int64]  # [R] the target's token's rank in the row (K: outside)
    depth: npt.NDArray[np.int64]  # [R] position within the block (0 … D − 1)
    root: npt.NDArray[np.int64]  # [R] a global id of the row's root (trace, position)
    request: npt.NDArray[np.int64]  # [R] the trace's index
    depths: int
    k: int


@public
def trace_stats(traces: Sequence[Trace]) -> TraceStats:
    """The rows of every dense trace whose target token is known (inside the recording)."""
    probs, rank, depth, root, request = [], [], [], [], []
    shapes = set()
    next_root = 0
    for i, t in enumerate(traces):
        if not t.dense:
            raise ConfigError(
                f"trace of prompt {t.metadata.get('prompt_id', i)} is not dense; record traces "
                f"with `bastion generate --record-trace PATH --dense-trace`"
            )
        if float(t.metadata.get("temperature", 0.0) or 0.0) > 0:
            raise ConfigError(
                f"trace of prompt {t.metadata.get('prompt_id', i)} was recorded at T > 0; a "
                f"workload is fitted to T = 0 traces (its temperature model is set separately)"
            )
        seq = _sequence(t)
        for pos in sorted(t.dense):
            m = t.dense[pos]
            shapes.add(m.probs.shape)
            d, k = m.probs.shape
            idx = pos + 1 + np.arange(d)
            keep = idx < seq.shape[0]
            if not keep.any():
                continue
            tok = seq[idx[keep]]
            ids = m.token_ids[keep]
            hit = ids == tok[:, None]
            r = np.where(hit.any(axis=1), hit.argmax(axis=1), k)
            probs.append(m.probs[keep])
            rank.append(r)
            depth.append(np.flatnonzero(keep))
            root.append(np.full(r.shape[0], next_root))
            request.append(np.full(r.shape[0], i))
            next_root += 1
    if len(shapes) != 1:
        raise ConfigError(f"traces disagree on the marginals' shape: {sorted(shapes)}")
    if not probs:
        raise ConfigError("the traces hold no row with a known target token")
    d, k = shapes.pop()
    return TraceStats(
        np.concatenate(probs),
        np.concatenate(rank).astype(np.int64),
        np.concatenate(depth).astype(np.int64),
        np.concatenate(root).astype(np.int64),
        np.concatenate(request).astype(np.int64),
        d,
        k,
    )


def _logit(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.asarray(np.log(p / (1 - p)), np.float64)


def _moments(st: TraceStats, fork_ratio_min: float) -> dict[str, Any]:
    """Method-of-moments estimates of every workload parameter from the rows."""
    d, k = st.depths, st.k
    q = st.probs
    fork = q[:, 1] >= fork_ratio_min * q[:, 0]
    head = q[:, 0] + np.where(fork, q[:, 1], 0.0)
    lg = _logit(head)
    base = np.array([lg[st.depth == j].mean() for j in range(d)])
    resid = lg - base[st.depth]
    # variance components: request, then root (step) within request, then position
    req_mean = np.bincount(st.request, resid) / np.bincount(st.request)
    r1 = resid - req_mean[st.request]
    roots = np.bincount(st.root)
    root_mean = np.bincount(st.root, r1) / np.maximum(roots, 1)
    pos_var = float(
        np.var(r1 - root_mean[st.root])
        * st.root.shape[0]
        / max(st.root.shape[0] - roots.astype(bool).sum(), 1)
    )
    step_var = max(
        float(np.average(root_mean[roots > 0] ** 2, weights=roots[roots > 0]))
        - pos_var / max(float(np.mean(roots[roots > 0])), 1.0),
        0.0,
    )
    req_rows = np.bincount(st.request)
    req_var = max(
        float(np.var(req_mean)) - (step_var + pos_var) / max(float(np.mean(req_rows)), 1.0) * 16.0,
        0.0,
    )  # rows of a root overlap: ~16× fewer free
    # branches: runs of ≥ 2 consecutive fork rows within a root's block
    order = np.lexsort((st.depth, st.root))
    f, r = fork[order], st.root[order]
    runs: list[int] = []
    branch_roots = set()
    length, prev = 0, -1
    for fi, ri in zip(f.tolist(), r.tolist(), strict=True):
        if ri != prev and length:
            if length >= 2:
                runs.append(length)
                branch_roots.add(prev)
            length = 0
        prev = ri
        if fi:
            length += 1
        elif length:
            if length >= 2:
                runs.append(length)
                branch_roots.add(ri)
            length = 0
    if length >= 2:
        runs.append(length)
        branch_roots.add(prev)
    branch_rate = len(branch_roots) / max(int(roots.astype(bool).sum()), 1)
    branch_len = float(np.mean(runs)) if runs else 2.0
    fork_rate = max(float(fork.mean()) - branch_rate * branch_len / d, 0.0)
    # runner-up spread: share of the non-head mass kept in the row, and its first runner's share
    rest = np.where(fork[:, None], np.c_[q[:, 2:], np.zeros(len(q))], q[:, 1:])
    mass = 1.0 - head
    ok = mass > 1e-6
    kept = float(np.mean(rest[ok].sum(axis=1) / mass[ok]))
    first = float(np.mean(rest[ok, 0] / mass[ok]))
    concentration, tail = _dirichlet_shape(k, kept, first)
    # the target's law: per depth, top-1 hits per unit of q₁; runners-up per unit of their mass
    align = np.ones(d)
    for j in range(d):
        s = st.depth == j
        align[j] = np.sum(st.rank[s] == 0) / max(np.sum(q[s, 0]), 1e-9)
    runner_hits = np.sum((st.rank > 0) & (st.rank < k))
    runner_mass = np.sum(q[:, 1:])
    lam = float(np.mean(align))
    return {
        "top1_by_depth": tuple(float(v) for v in 1 / (1 + np.exp(-base))),
        "alignment": lam,
        "alignment_by_depth": tuple(float(v) for v in align / lam),
        "runner_alignment": float(runner_hits / max(runner_mass, 1e-9)) / lam,
        "difficulty_sd": math.sqrt(req_var),
        "step_sd": math.sqrt(step_var),
        "position_sd": math.sqrt(pos_var),
        "fork_rate": fork_rate,
        "branch_rate": branch_rate,
        "branch_len": branch_len,
        "concentration": concentration,
        "tail_alpha": tail,
    }


def _dirichlet_shape(k: int, kept: float, first: float) -> tuple[float, float]:
    """(concentration α, tail α_t) whose Dirichlet over K − 1 runners-up and the tail keeps the
    share ``kept`` in the row (α·(K−1)/(α·(K−1)+α_t)) and gives its largest runner-up about
    ``first`` of the mass (measured on a small sample of sorted draws)."""
    kept = float(np.clip(kept, 0.05, 0.999))
    rng = np.random.default_rng(0)
    best, best_err = (1.0, 1.0), math.inf
    for alpha in np.geomspace(0.02, 5.0, 40):
        tail = alpha * (k - 1) * (1 - kept) / kept
        g = rng.standard_gamma(np.r_[np.full(k - 1, alpha), tail], size=(400, k))
        share = g[:, :-1] / g.sum(axis=1, keepdims=True)
        err = abs(float(np.mean(share.max(axis=1))) - first)
        if err < best_err:
            best, best_err = (float(alpha), float(max(tail, 1e-3))), err
    return best


@public
def fit_traces(
    traces: Sequence[Trace],
    name: str = "fitted",
    sizes: Sequence[Size] = FIT_SIZES,
    requests: int = 256,
    seed: int = 0,
    fork_ratio_min: float = 0.5,
    refine: bool = True,
) -> tuple[Workload, dict[str, object]]:
    """A workload fitted to dense T = 0 traces, and a report of the fit.

    Moments first (see :func:`_moments`); then, unless ``refine`` is False, the top-1
    alignment, the runner-up alignment and the step spread are scaled by least squares on the
    relative error of τ(N) against the traces' own replayed τ(N) at ``sizes`` (the traces'
    acceptance curve is the thing the workload must reproduce; within-block correlations that
    the moments cannot see end up in these three)."""
    _check_sizes(sizes)
    st = trace_stats(traces)
    est = _moments(st, fork_ratio_min)
    prompt = int(np.median([len(t.prompt_ids) for t in traces]))
    output = int(np.median([len(t.output_ids) for t in traces]))
    top1 = est["top1_by_depth"]
    assert isinstance(top1, tuple)
    base = Workload(
        name,
        top1=float(top1[0]),
        decay=1.0,
        concentration=float(est["concentration"]),
        alignment=float(np.clip(est["alignment"], 1e-3, Workload.MAX_ALIGNMENT)),
        difficulty_sd=float(est["difficulty_sd"]),
        tail_alpha=float(est["tail_alpha"]),
        output_len=max(output, 1),
        prompt_len=max(prompt, 1),
        depth=st.depths,
        k=st.k,
        step_sd=float(est["step_sd"]),
        position_sd=float(est["position_sd"]),
        fork_rate=float(min(est["fork_rate"], 0.99)),
        branch_rate=float(est["branch_rate"]),
        branch_len=float(est["branch_len"]),
        fork_ratio_min=fork_ratio_min,
        runner_alignment=float(np.clip(est["runner_alignment"], 1e-3, Workload.MAX_ALIGNMENT)),
        top1_by_depth=top1,
        alignment_by_depth=tuple(
            float(np.clip(v, 1e-3, Workload.MAX_ALIGNMENT)) for v in est["alignment_by_depth"]
        ),
        description=f"fitted to {len(traces)} dense trace(s) by `bastion workload fit`",
    )
    measured = replay_tau(traces, sizes)
    fitted = base
    if refine:

        def model(x: npt.NDArray[np.float64]) -> Workload:
            return base.with_(
                alignment=float(np.clip(base.alignment * math.exp(x[0]), 1e-3, 20.0)),
                runner_alignment=float(
                    np.clip((base.runner_alignment or 1.0) * math.exp(x[1]), 1e-3, 20.0)
                ),
                step_sd=float(base.step_sd * math.exp(x[2])),
            )

        def residual(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            got = synthetic_tau(model(x), sizes, requests, 32, seed)
            return np.array([got[n] / measured[n] - 1.0 for n in sizes])

        def jacobian(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            # forward differences with a step of 0.05 in log scale: the Monte Carlo estimate is
            # smooth at that scale (common random numbers), not at machine precision
            r0 = residual(x)
            cols = [(residual(x + 0.05 * e) - r0) / 0.05 for e in np.eye(3)]
            return np.stack(cols, axis=1)

        sol = optimize.least_squares(
            residual, np.zeros(3), jac=jacobian, bounds=([-2, -3, -3], [2, 3, 2]), max_nfev=30
        )
        fitted = model(sol.x)
    predicted = synthetic_tau(fitted, sizes, requests, 32, seed + 1)
    report: dict[str, object] = {
        "traces": len(traces),
        "rows": int(st.rank.shape[0]),
        "refined": refine,
        "sizes": [str(n) for n in sizes],
        "replayed_tau": [round(measured[n], 4) for n in sizes],
        "fitted_tau": [round(predicted[n], 4) for n in sizes],
    }
    return fitted, report


# -- fitting to published numbers ----------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A published number: τ at size ``n`` (``ratio_to`` None) or τ(n)/τ(``ratio_to``), of the
    mean over a group of workloads (a benchmark average over several datasets)."""

    n: Size
    value: float
    ratio_to: Size | None = None

    def of(self, taus: Sequence[dict[Size, float]]) -> float:
        """The quantity for a group: each member's τ averaged, then the ratio (if any)."""
        mean = float(np.mean([t[self.n] for t in taus]))
        if self.ratio_to is None:
            return mean
        return mean / float(np.mean([t[self.ratio_to] for t in taus]))

    def label(self) -> str:
        n = "chain" if self.n == "chain" else f"N = {self.n}"
        if self.ratio_to is None:
            return f"τ at {n}"
        return f"τ({self.n}) / τ({self.ratio_to})"


def _logit1(p: float) -> float:
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


RATES = ("fork_rate", "branch_rate")  # fitted on the logit scale; other parameters on the log


def fit_to_targets(
    group: Sequence[Workload],
    offsets: Sequence[float],
    targets: Sequence[Target],
    free: Sequence[str] = ("top1", "fork_rate"),
    requests: int = 1024,
    steps: int = 32,
    seed: int = 0,
) -> tuple[list[Workload], dict[str, float]]:
    """Fit the ``free`` parameters of a group of workloads, common to all members, to as many
    published targets, by least squares with common random numbers. ``top1`` is a head
    log-odds level (member i gets level + ``offsets[i]``); rates (``fork_rate``,
    ``branch_rate``) are fitted on the logit scale, anything else (``runner_alignment``,
    ``alignment``) on the log scale. Returns the fitted members and the targets' values as the
    fitted group gives them."""
    if len(targets) != len(free):
        raise ConfigError(f"fit_to_targets fits {len(free)} parameters to as many targets")
    sizes = sorted({t.n for t in targets} | {t.ratio_to for t in targets if t.ratio_to}, key=str)
    base = group[0]

    def to_x(name: str) -> float:
        value = getattr(base, name)
        if name in ("top1", *RATES):
            return _logit1(min(max(value if value is not None else 0.1, 0.02), 0.98))
        return math.log(value if value is not None else base.alignment)

    def members(x: npt.NDArray[np.float64]) -> list[Workload]:
        out = []
        for w, o in zip(group, offsets, strict=True):
            change: dict[str, float] = {}
            for name, v in zip(free, x.tolist(), strict=True):
                if name == "top1":
                    change[name] = min(_sigmoid(v + o), 1 - 1e-9)
                elif name in RATES:
                    change[name] = min(_sigmoid(v), 0.99)
                else:
                    change[name] = min(math.exp(v), Workload.MAX_ALIGNMENT)
            out.append(w.with_(**change))
        return out

    def values(x: npt.NDArray[np.float64]) -> list[float]:
        taus = [synthetic_tau(w, sizes, requests, steps, seed) for w in members(x)]
        return [t.of(taus) for t in targets]

    def residual(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.array([v / t.value - 1 for v, t in zip(values(x), targets, strict=True)])

    def jacobian(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        r0 = residual(x)
        steps_ = np.eye(len(free)) * 0.05
        return np.stack([(residual(x + e) - r0) / 0.05 for e in steps_], axis=1)

    x0 = np.array([to_x(name) for name in free])
    sol = optimize.least_squares(residual, x0, jac=jacobian, max_nfev=40, xtol=1e-4)
    fitted = members(sol.x)
    return fitted, {t.label(): v for t, v in zip(targets, values(sol.x), strict=True)}
