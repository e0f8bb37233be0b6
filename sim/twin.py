"""The simulator's side of ``bastion twin``: replay real requests, and compare with the real run.

The real backend decodes prompts with each policy and records what the simulator needs to replay
exactly those requests (:mod:`bastion.backends.torch.twin`): the prompts' lengths, the target's
tokens and the drafter's marginals at every position (dense traces), the batch size, and the
controller's belief. :func:`replay` serves the same requests on a :class:`SimulatedGPU` — all
submitted at once in prompt order, at most ``batch_size`` in service, each prompt prefilled
whole in a pass of its own and joining the next decode step (as the real loop does) — and
summarises each policy as a
:class:`TwinRow`, the same fields as the real run's rows, so that :func:`compare` can set them
side by side with the error of each.

Statistics are the real report's: TPOT is the median over requests (``tpot_p50_s``); the
speedup is AR's median TPOT over the policy's, within one source and batch size; the cycle's
parts are means per decode step (draft, host = build + loop, verify; the real run's without its
stalls, :func:`bastion.backends.torch.twin.bulk_mean`); the decision mix is the share of decode
steps of each kind.

What this module does not do: run models (the torch side does) or fit truths
(:mod:`bastion.sim.measured`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.errors import ConfigError
from bastion.guard import integer, public, writable_file
from bastion.interfaces import CostModel
from bastion.policies import make_policy
from bastion.sim.arrivals import Arrival
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.ground_truth import GroundTruth
from bastion.sim.replay import TraceSource
from bastion.sim.serving import ServingResult, serve
from bastion.trace import Trace

__all__ = [
    "TWIN_FIELDS",
    "TwinRow",
    "compare",
    "format_comparison",
    "plot_twin",
    "replay",
    "summary",
    "with_speedups",
]

# a replay's speeds: per run, a number or one per decode step (see replay)
Speeds = Sequence[float | Sequence[float]]

# two identical AR contenders in lockstep read this far apart by the median TPOT over requests
# (95th percentile, benchmarks/bench_lockstep_noise.py, docs/benchmarks.md): policies closer
# than this in the real run are not ranked against each other
RANK_BAND = 0.039
WHOLE_PROMPT = 1 << 30  # prefill chunk: every prompt prefilled in one piece, as the real loop

# the fields compared, with how each is shown: (field, label, scale, format)
TWIN_FIELDS: tuple[tuple[str, str, float, str], ...] = (
    ("tpot_p50_s", "TPOT ms", 1e3, "{:.3f}"),
    ("speedup", "speedup", 1.0, "{:.3f}"),
    ("ttft_mean_s", "TTFT ms", 1e3, "{:.2f}"),
    ("tau", "τ", 1.0, "{:.3f}"),
    ("mean_tree_size", "mean N", 1.0, "{:.1f}"),
    ("draft_s", "draft ms", 1e3, "{:.3f}"),
    ("host_s", "host ms", 1e3, "{:.3f}"),
    ("verify_s", "verify ms", 1e3, "{:.3f}"),
    ("share_ar", "AR %", 100.0, "{:.0f}"),
    ("share_chain", "chain %", 100.0, "{:.0f}"),
    ("share_tree", "tree %", 100.0, "{:.0f}"),
)


@dataclass(frozen=True)
class TwinRow:
    """One policy at one batch size from one source (``real``, ``sim``, or a prediction made
    without measuring, such as ``roofline``), in the record vocabulary (seconds)."""

    source: str
    policy: str
    batch_size: int
    tpot_p50_s: float  # median over requests (every timed run's, for a real run)
    tpot_mean_s: float
    ttft_mean_s: float
    e2e_mean_s: float
    tau: float  # delivered tokens per step, bonus included, over every request's steps
    mean_tree_size: float
    steps: int  # batched decode steps (a real run's first timed run)
    draft_s: float  # mean per decode step
    host_s: float  # build + loop, mean per decode step
    verify_s: float
    share_ar: float  # share of decode steps of each kind
    share_chain: float
    share_tree: float
    speedup: float = math.nan  # AR's tpot_p50_s over this one, same source and batch size
    # per request, the tokens each step delivered (bonus included), prompt order
    committed: tuple[tuple[int, ...], ...] = ()
    # every run's per-request TPOTs, runs in order, each in prompt order
    request_tpots: tuple[tuple[float, ...], ...] = ()

    @property
    def cycle_s(self) -> float:
        return self.draft_s + self.host_s + self.verify_s

    def to_record(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("committed")
        d["request_tpots"] = [list(run) for run in self.request_tpots]
        d["cycle_s"] = self.cycle_s
        return d


def _shares(kinds: Mapping[str, int]) -> tuple[float, float, float]:
    total = sum(kinds.values())
    if not total:
        return 0.0, 0.0, 0.0
    return tuple(kinds.get(k, 0) / total for k in ("ar", "chain", "tree"))  # type: ignore[return-value]


def _row(source: str, batch_size: int, runs: Sequence[ServingResult]) -> TwinRow:
    """A row from ``runs`` of the same requests: TPOT pooled over every run's requests and the
    cycle's parts and the decision mix over every run's steps (as the real report pools its
    timed runs), the rest from the first run."""
    served = runs[0]
    reqs = sorted(served.requests, key=lambda r: r.request_id)
    tpots = [r.tpot_s for run in runs for r in run.requests if r.tokens > 1]
    steps = max(sum(run.steps for run in runs), 1)
    committed = [n for r in reqs for n in r.committed]
    sizes = [s for r in reqs for s in r.tree_sizes]
    kinds: dict[str, int] = {}
    for run in runs:
        for k, n in run.step_kinds.items():
            kinds[k] = kinds.get(k, 0) + n
    ar, chain, tree = _shares(kinds)
    return TwinRow(
        source=source,
        policy=served.policy,
        batch_size=batch_size,
        tpot_p50_s=float(np.median(tpots)) if tpots else 0.0,
        tpot_mean_s=float(np.mean(tpots)) if tpots else 0.0,
        ttft_mean_s=float(np.mean([r.ttft_s for r in reqs])),
        e2e_mean_s=float(np.mean([r.e2e_s for r in reqs])),
        tau=float(np.mean(committed)) if committed else 0.0,
        mean_tree_size=float(np.mean(sizes)) if sizes else 1.0,
        steps=served.steps,
        draft_s=sum(run.draft_s for run in runs) / steps,
        host_s=sum(run.prep_s for run in runs) / steps,
        verify_s=sum(run.verify_s for run in runs) / steps,
        share_ar=ar,
        share_chain=chain,
        share_tree=tree,
        committed=tuple(tuple(r.committed) for r in reqs),
        request_tpots=tuple(
            tuple(r.tpot_s for r in sorted(run.requests, key=lambda q: q.request_id))
            for run in runs
        ),
    )


@public
def with_speedups(rows: Sequence[TwinRow]) -> list[TwinRow]:
    """Each row with its speedup over the AR row of its source and batch size."""
    ar = {(r.source, r.batch_size): r.tpot_p50_s for r in rows if r.policy == "ar"}
    out = []
    for r in rows:
        base = ar.get((r.source, r.batch_size), math.nan)
        speedup = base / r.tpot_p50_s if r.tpot_p50_s > 0 else math.nan
        out.append(dataclasses.replace(r, speedup=speedup))
    return out


@public(
    batch_size=integer(1, 1 << 16),
    n_max=integer(1, 1 << 20),
    seed=integer(lo=0),
    repeats=integer(1, 1000),
)
def replay(
    traces: Sequence[Trace],
    policies: Sequence[str],
    *,
    batch_size: int,
    hardware: HardwareProfile,
    model: ModelSpec,
    drafter: DrafterSpec,
    truth: GroundTruth,
    beliefs: Mapping[str, CostModel | None] | None = None,
    source: str = "sim",
    n_max: int = 1024,
    seed: int = 0,
    repeats: int = 1,
    speeds: Speeds | Mapping[str, Speeds] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TwinRow]:
    """Serve the traced requests with every policy on the simulated GPU; one row each.

    ``traces[i]`` is request i (its prompt, the target's tokens, the drafter's marginals at every
    position: a dense trace). ``beliefs[policy]`` is the cost model a policy that uses one is
    given (the real run's, so both decide from the same belief; a learning controller's is
    copied per run). Every request arrives at time 0; at most ``batch_size`` are served at once,
    in order, each prompt prefilled whole. ``repeats`` runs of them (each its own noise seed),
    pooled as the real report pools its timed runs; a learning controller keeps its learner
    from one run to the next, as it does for real. ``speeds`` (a measured truth only): one per
    run — a number (run r on a machine ``speeds[r]`` times as slow) or a sequence (its k-th
    decode step, and the prefills just before it, at ``speeds[r][k]``; the last beyond its end:
    the real machine's speed when the real run's k-th step ran) — or a mapping from each policy
    to its own such list."""
    if speeds is not None and truth.measured is None:
        raise ConfigError("speeds need a measured truth (they scale its terms)")
    if not traces:
        raise ConfigError("twin replay needs at least one trace (one per request)")
    if not all(isinstance(t, Trace) for t in traces):
        raise ConfigError("twin replay: traces must be bastion.trace.Trace objects")
    if not policies:
        raise ConfigError("twin replay needs at least one policy")
    arrivals = [Arrival(0.0, len(t.prompt_ids), len(t.output_ids)) for t in traces]
    rows = []
    for name in policies:
        if progress is not None:
            progress(f"replaying {name} at batch {batch_size} on the simulated device ({source})")
        policy = make_policy(name, n_max=n_max)
        belief = (beliefs or {}).get(name)
        copy = getattr(belief, "copy", None)
        if getattr(policy, "learns", False) and callable(copy):
            belief = copy()  # a learner of its own, from the same start-up table
        runs = []
        paces = _run_speeds(speeds, name, repeats)
        for r in range(repeats):
            run_truth, pace = truth, paces[r]
            if isinstance(pace, float) and truth.measured is not None:
                scaled = truth.measured.scaled(pace)
                run_truth = dataclasses.replace(truth, measured=scaled)
            gpu = (
                _PacedGPU(
                    pace, hardware, model, drafter, run_truth, seed=seed + r, max_tree_size=n_max
                )
                if isinstance(pace, tuple)
                else SimulatedGPU(
                    hardware, model, drafter, run_truth, seed=seed + r, max_tree_size=n_max
                )
            )
            served = serve(
                policy,
                gpu,
                TraceSource([(t, f"request {i}") for i, t in enumerate(traces)]),
                cost_model=belief if getattr(policy, "uses_cost_model", False) else None,
                concurrency=batch_size,
                arrivals=arrivals,
                prefill_chunk=WHOLE_PROMPT,
                prefill_alone=True,
            )
            served.policy = name
            runs.append(served)
        rows.append(_row(source, batch_size, runs))
    return with_speedups(rows)


def _run_speeds(
    speeds: Speeds | Mapping[str, Speeds] | None, policy: str, repeats: int
) -> list[float | tuple[float, ...] | None]:
    """``policy``'s speed of each run (see :func:`replay`): None (the truth as it is), a number,
    or a tuple (one per decode step); malformed speeds are refused."""
    if speeds is None:
        return [None] * repeats
    if isinstance(speeds, Mapping):
        if policy not in speeds:
            raise ConfigError(f"speeds has no entry for policy {policy!r}")
        speeds = speeds[policy]
    if isinstance(speeds, str) or not isinstance(speeds, Sequence):
        raise ConfigError(f"speeds must be a sequence, one per run; got {speeds!r:.60}")
    if len(speeds) != repeats:
        raise ConfigError(f"{len(speeds)} speeds for {repeats} runs; give one per run")
    out: list[float | tuple[float, ...] | None] = []
    for run in speeds:
        values = [run] if not isinstance(run, Sequence) or isinstance(run, str) else list(run)
        if not values or not all(
            not isinstance(v, bool)
            and isinstance(v, int | float)
            and math.isfinite(v)
            and float(v) > 0
            for v in values
        ):
            raise ConfigError(
                f"a run's speed must be a finite number > 0 or a non-empty sequence of them; "
                f"got {run!r:.60}"
            )
        out.append(tuple(map(float, values)) if isinstance(run, Sequence) else float(values[0]))
    return out


class _PacedGPU(SimulatedGPU):
    """A simulated device whose k-th decode step, and the prefills just before it, run
    ``pace[k]`` times as slow (the last factor beyond the end)."""

    def __init__(self, pace: tuple[float, ...], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pace = pace
        self._step = 0

    def _factor(self) -> float:
        return self.pace[min(self._step, len(self.pace) - 1)]

    def prefill_s(self, new_tokens: Any, contexts: Any) -> float:
        return super().prefill_s(new_tokens, contexts) * self._factor()

    def step_s(self, *args: Any, **kwargs: Any) -> tuple[float, float, float]:
        f = self._factor()
        self._step += 1
        draft, host, verify = super().step_s(*args, **kwargs)
        self.unobserved_s *= f
        return draft * f, host * f, verify * f


def _error(sim: float, real: float) -> float:
    """Signed relative error of ``sim`` against ``real`` (nan where real is 0 or nan)."""
    if not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return math.nan
    return sim / real - 1.0


@public
def compare(rows: Sequence[TwinRow], against: str = "real") -> list[dict[str, Any]]:
    """One entry per (policy, batch size, other source): every :data:`TWIN_FIELDS` value of
    both sources and the other's relative error against ``against`` (decision shares: the
    difference in points instead)."""
    real = {(r.policy, r.batch_size): r for r in rows if r.source == against}
    out = []
    for r in rows:
        if r.source == against:
            continue
        base = real.get((r.policy, r.batch_size))
        if base is None:
            continue
        entry: dict[str, Any] = {"policy": r.policy, "batch_size": r.batch_size}
        entry["source"] = r.source
        for name, *_ in TWIN_FIELDS:
            a, b = getattr(base, name), getattr(r, name)
            entry[f"{name}_{against}"] = a
            entry[name] = b
            entry[f"{name}_error"] = b - a if name.startswith("share_") else _error(b, a)
        entry["committed_exact"] = bool(base.committed) and base.committed == r.committed
        out.append(entry)
    return out


def _check_entries(entries: Sequence[Mapping[str, Any]], against: str) -> None:
    """Entries as :func:`compare` makes them, or a ConfigError naming what is missing."""
    needed = {"policy", "batch_size", "source"}
    for name, *_ in TWIN_FIELDS:
        needed |= {name, f"{name}_{against}", f"{name}_error"}
    for i, e in enumerate(entries):
        missing = sorted(needed - set(e))
        if missing:
            raise ConfigError(
                f"comparison entry {i} lacks {', '.join(missing[:4])}: give what compare() returns"
            )


@public
def format_comparison(entries: Sequence[Mapping[str, Any]], against: str = "real") -> str:
    """The comparison as a text table: per policy and batch size, real → other (error)."""
    _check_entries(entries, against)
    shown = ("tpot_p50_s", "speedup", "tau", "mean_tree_size", "draft_s", "host_s", "verify_s")
    labels = {f: (label, scale, fmt) for f, label, scale, fmt in TWIN_FIELDS}
    head = f"{'source':<9}{'policy':<14}{'B':>3} "
    head += " ".join(f"{labels[f][0]:>22}" for f in shown) + f" {'mix AR/chain/tree %':>26}"
    lines = [head]
    for e in entries:
        cells = []
        for f in shown:
            _, scale, fmt = labels[f]
            a, b, err = e[f"{f}_{against}"], e[f], e[f"{f}_error"]
            text = f"{fmt.format(a * scale)}→{fmt.format(b * scale)}"
            text += f" ({err * 100:+.1f}%)" if math.isfinite(err) else ""
            cells.append(f"{text:>22}")
        mix = "/".join(f"{e[f'share_{k}_{against}'] * 100:.0f}" for k in ("ar", "chain", "tree"))
        mix += " → " + "/".join(f"{e[f'share_{k}'] * 100:.0f}" for k in ("ar", "chain", "tree"))
        lines.append(
            f"{e['source']:<9}{e['policy']:<14}{e['batch_size']:>3} "
            + " ".join(cells)
            + f" {mix:>26}"
        )
    return "\n".join(lines)


def _ranking(entries: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Pairs of policies (same batch size) ranked by TPOT: how many the real run separates by
    more than :data:`RANK_BAND`, and how many of those the other source ranks the other way."""
    ranked = flipped = 0
    for a, b in itertools.combinations(entries, 2):
        if a["batch_size"] != b["batch_size"]:
            continue
        ra, rb = a["tpot_p50_s_real"], b["tpot_p50_s_real"]
        if abs(ra / rb - 1.0) < RANK_BAND:
            continue
        ranked += 1
        flipped += (ra < rb) != (a["tpot_p50_s"] < b["tpot_p50_s"])
    return {"ranked_pairs": float(ranked), "ranking_flips": float(flipped)}


@public
def summary(entries: Sequence[Mapping[str, Any]], source: str = "sim") -> dict[str, float]:
    """The twin's headline numbers for one source: worst and mean |error| of the speedup over
    AR (policies other than AR) and of the median TPOT, the worst decision-mix gap, and the
    pairs of policies the real run ranks apart (by more than :data:`RANK_BAND`) and how many of
    them the source ranks the other way."""
    _check_entries(entries, "real")
    mine = [e for e in entries if e["source"] == source]
    speed = [abs(e["speedup_error"]) for e in mine if e["policy"] != "ar"]
    tpot = [abs(e["tpot_p50_s_error"]) for e in mine]
    mix = [abs(e[f"share_{k}_error"]) for e in mine for k in ("ar", "chain", "tree")]
    nan = math.nan
    return {
        **_ranking(mine),
        "speedup_error_max": max(speed, default=nan),
        "speedup_error_mean": statistics.fmean(speed) if speed else nan,
        "tpot_error_max": max(tpot, default=nan),
        "tpot_error_mean": statistics.fmean(tpot) if tpot else nan,
        "mix_gap_max": max(mix, default=nan),
    }


@public(path=writable_file)
def plot_twin(rows: Sequence[TwinRow], path: Any, against: str = "real") -> None:
    """Simulated against measured median TPOT per policy, one panel per batch size, with every
    other source beside the simulator (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - the dev extra has it
        raise ConfigError("the twin's plot needs matplotlib: pip install 'bastion[plot]'") from exc
    from bastion.files import save_figure_atomic

    sizes = sorted({r.batch_size for r in rows})
    if not sizes:
        raise ConfigError("plot_twin: no rows to plot")
    others = {r.source for r in rows} - {against}
    # the measured truth's replay beside the real run, then the predictions without measuring
    sources = [against, *sorted(others, key=lambda s: (s != "sim", s))]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.2), squeeze=False)
    for ax, b in zip(axes[0], sizes, strict=True):
        policies = [r.policy for r in rows if r.source == against and r.batch_size == b]
        width = 0.8 / len(sources)
        for k, source in enumerate(sources):
            values = {
                r.policy: r.tpot_p50_s * 1e3
                for r in rows
                if r.source == source and r.batch_size == b
            }
            xs = [i + (k - (len(sources) - 1) / 2) * width for i in range(len(policies))]
            ax.bar(xs, [values.get(p, math.nan) for p in policies], width, label=source)
        ax.set_xticks(range(len(policies)), policies, rotation=35, ha="right")
        ax.set_title(f"batch {b}")
        ax.set_ylabel("median TPOT (ms)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("bastion twin: measured (real) against simulated TPOT")
    fig.tight_layout()
    save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
