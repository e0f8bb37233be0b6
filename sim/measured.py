"""A measured truth: a device's pass and host costs fitted from real steps, for the simulator.

The roofline truths (``sim/truths/*.toml``) say how a *GPU* departs from its roofline. A
measured truth instead prices every part of a step from times measured on the machine itself
(:mod:`bastion.backends.torch.twin` measures them on calibration prompts; any
:class:`~bastion.stepcosts.StepSample` list will do), so the simulator can be checked against
real runs on hardware no profile describes — a CPU, where the host's work and the device's add
up instead of overlapping. It is a ``[measured]`` section of an ordinary truth file; a truth with
it prices passes from it alone (the roofline fields are then unused).

The terms, each fitted by non-negative least squares on relative error (a fast pass counts as
much as a slow one), with R the requests of the step (rows of the batched pass), N the largest
tree (the pass pads every row to it), L the longest context (the cache's length) and T = R·N:

- ``verify.<kind>`` (kind ``ar``, ``chain``, ``tree``): the target's forward pass, and
  ``verify.<kind>_mask``, ``_accept``, ``_commit`` the verifier's host work around it — masks
  and positions (every step, AR included), the acceptance walks, the KV compaction and the rest
  of the call — each h(T) + row_s·(R − 1) + attention_s·R·N·(L + N) + cache_s·R·L, with h
  piecewise linear in T between knots at powers of two (linear beyond the last); for ``ar``
  N = 1 and no row term (h(R) carries it). Where the verifier's stages were not timed apart,
  ``verify.<kind>`` alone is its whole call;
- ``draft.<preparation>`` (``argmax``: the chain's top-1 path; ``topk``: top-K marginals for
  trees): g(R) + context_s·ΣL + append_s·ΣA, g piecewise linear in R, A the target features a
  request's context takes before the pass (the tokens committed since its last draft);
- ``host.<kind>_<control>`` (control ``static``: a fixed policy; ``decide``: the controller
  decided the step; ``repeat``: it repeated its last decision): the tree build or the
  controller's choice, step_s + batched_s·[R ≥ 2] + request_s·R + node_s·ΣN (batched_s: the
  batched paths a single request's step does not take, such as the controllers' joint decision
  over the batch); and ``loop.<kind>_<control>``, the rest
  of the step's wall time outside the draft, build and verify calls (the learning update after
  the pass, the decode loop's bookkeeping), of the same form. A missing control falls back to
  ``repeat`` ↔ ``decide``, then ``static`` of the same kind. A tree policy with its own builder
  (``beam``, ``eagle``: ``tree_builder`` of the policy) has its own ``host.beam_static`` … where
  it was measured, else the best-first tree's. A learning controller learns from
  draft + build + verify, as the real engine reports it: the loop's part is charged to the step
  but not shown to the learner (:attr:`bastion.sim.gpu.SimulatedGPU.unobserved_s`);
- ``prefill``: one prompt of n tokens prefilled alone: pass_s + token_s·n + token2_s·n².

A batched pass that carries prefill chunks (the simulator's chunked prefill) is priced as the
decode pass plus each chunk prefilled alone (a chunk of n tokens over c cached ones as
prefill(c + n) − prefill(c)), which is what the real backend does: it prefills each prompt on
its own before the step.

What this module does not do: measure (the real backend does), fit
(:mod:`bastion.sim.measured_fit`), write truth files (:mod:`bastion.sim.measured_file`) or
decide anything.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.guard import public
from bastion.stepcosts import BUILDERS, CONTROLS, KINDS, StepSample

__all__ = [
    "Curve",
    "DraftTerm",
    "HostTerm",
    "MeasuredCosts",
    "PrefillTerm",
    "VerifyTerm",
    "measured_from_dict",
]

Array = npt.NDArray[np.float64]

_STAGE_TERMS = ("mask", "accept", "commit")  # the verifier's host stages beside its pass
_FALLBACK = {
    "static": ("static",),
    "decide": ("decide", "repeat", "static"),
    "repeat": ("repeat", "decide", "static"),
}
_MIN_SAMPLES = 3  # a term needs this many samples to be fitted


@dataclass(frozen=True)
class Curve:
    """A piecewise-linear curve through (knots, values), extended linearly beyond its ends."""

    knots: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        k, v = _floats(self.knots, "knots"), _floats(self.values, "values")
        if not k or len(k) != len(v):
            raise ConfigError(
                f"a measured curve needs as many values as knots (≥ 1); got {len(k)} knots and "
                f"{len(v)} values"
            )
        if any(b <= a for a, b in itertools.pairwise(k)) or k[0] < 1:
            raise ConfigError(f"a measured curve's knots must rise strictly from ≥ 1; got {k}")
        if not all(math.isfinite(x) and x >= 0 for x in v):
            raise ConfigError(f"a measured curve's values must be finite seconds ≥ 0; got {v}")
        object.__setattr__(self, "knots", k)
        object.__setattr__(self, "values", v)

    def __call__(self, x: float) -> float:
        k, v = self.knots, self.values
        if len(k) == 1:
            return v[0]
        i = min(max(bisect.bisect_right(k, x) - 1, 0), len(k) - 2)
        w = (x - k[i]) / (k[i + 1] - k[i])
        return max(v[i] + w * (v[i + 1] - v[i]), 0.0)


def _finite(x: object) -> bool:
    """Whether ``x`` converts to a finite float (an int too large for one does not)."""
    try:
        return math.isfinite(float(x))  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return False


def _floats(values: object, what: str) -> tuple[float, ...]:
    """A tuple of finite numbers, or a ConfigError saying what ``values`` was."""
    if (
        isinstance(values, str | bytes)
        or not hasattr(values, "__iter__")
        or (isinstance(values, np.ndarray) and values.ndim != 1)
    ):
        raise ConfigError(
            f"a measured curve's {what} must be a list of numbers; got {values!r:.60}"
        )
    out = []
    for x in values:
        if isinstance(x, bool) or not isinstance(x, int | float | np.floating | np.integer):
            raise ConfigError(f"a measured curve's {what} must be numbers; got {x!r:.60}")
        if not _finite(x):
            raise ConfigError(f"a measured curve's {what} must be finite; got {x!r}")
        out.append(float(x))
    return tuple(out)


def _checked(term: object, names: Sequence[str], curve: bool = False) -> None:
    """Every field in ``names`` of a measured term a finite number of seconds ≥ 0 (stored as a
    float), ``samples`` a whole number ≥ 0, and with ``curve`` its ``pass_s`` a Curve."""
    where = type(term).__name__
    if curve and not isinstance(getattr(term, "pass_s", None), Curve):
        shown = getattr(term, "pass_s", None)
        raise ConfigError(f"{where}: pass_s must be a Curve; got {shown!r:.60}")
    for name in names:
        value = getattr(term, name)
        if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
            raise ConfigError(f"{where}: {name} must be a number of seconds; got {value!r:.60}")
        if not (_finite(value) and value >= 0):
            raise ConfigError(f"{where}: {name} must be finite and ≥ 0; got {value!r}")
        object.__setattr__(term, name, float(value))
    n = getattr(term, "samples", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"{where}: samples must be a whole number ≥ 0; got {n!r:.60}")


def _num(data: Mapping[str, Any], key: str, where: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: '{key}' must be a number; got {value!r}")
    if not (_finite(value) and value >= 0):
        raise ConfigError(f"{where}: '{key}' must be a finite number ≥ 0; got {value!r:.60}")
    v = float(value)
    if not (math.isfinite(v) and v >= 0):
        raise ConfigError(f"{where}: '{key}' must be a finite number ≥ 0; got {value!r}")
    return v


def _list(data: Mapping[str, Any], key: str, where: str) -> list[float]:
    value = data.get(key)
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        raise ConfigError(f"{where}: '{key}' must be a list of numbers; got {value!r}")
    return [float(v) for v in value]


def _only(data: object, keys: Iterable[str], where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a table")
    accepted = set(keys) | {"samples"}
    unknown = sorted(set(data) - accepted)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(sorted(accepted))}"
        )
    if "samples" in data:
        n = data["samples"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"{where}: 'samples' must be a whole number ≥ 0; got {n!r}")
    return data


def _curve(data: Mapping[str, Any], where: str) -> Curve:
    try:
        return Curve(tuple(_list(data, "knots", where)), tuple(_list(data, "pass_s", where)))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class VerifyTerm:
    """The verifier's call: h(R·N) + row_s·(R − 1) + attention_s·R·N·(L + N) + cache_s·R·L."""

    pass_s: Curve
    row_s: float = 0.0
    attention_s: float = 0.0
    cache_s: float = 0.0
    samples: int = 0

    def __post_init__(self) -> None:
        _checked(self, ("row_s", "attention_s", "cache_s"), curve=True)

    def __call__(self, rows: int, size: int, context: int) -> float:
        r, n, c = float(rows), float(size), float(context)
        return (
            self.pass_s(r * n)
            + self.row_s * (r - 1.0)
            + self.attention_s * r * n * (c + n)
            + self.cache_s * r * c
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "knots": list(self.pass_s.knots),
            "pass_s": list(self.pass_s.values),
            "row_s": self.row_s,
            "attention_s": self.attention_s,
            "cache_s": self.cache_s,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: object, where: str) -> VerifyTerm:
        keys = ("knots", "pass_s", "row_s", "attention_s", "cache_s")
        d = _only(data, keys, where)
        row, attention, cache = (_num(d, k, where) for k in keys[2:])
        return cls(_curve(d, where), row, attention, cache, int(d.get("samples", 0)))


@dataclass(frozen=True)
class DraftTerm:
    """The drafter's batched pass: g(R) + context_s·ΣL + append_s·ΣA.

    A is what the drafter appends to a request's context before its block pass: the target's
    features of the tokens committed since it last drafted (the prompt's at a request's first
    draft; every AR step's in between for a controller that skipped drafting), each projected
    and written into its k/v cache. ``appended`` is the mean A per request over the samples
    the term was fitted on: what a step whose A is not known is priced at."""

    pass_s: Curve
    context_s: float = 0.0
    samples: int = 0
    append_s: float = 0.0
    appended: float = 0.0

    def __post_init__(self) -> None:
        _checked(self, ("context_s", "append_s"), curve=True)
        a = self.appended
        if (
            isinstance(a, bool)
            or not isinstance(a, int | float | np.floating | np.integer)
            or not (_finite(a) and float(a) >= 0)
        ):
            raise ConfigError(
                f"DraftTerm: appended must be a finite number ≥ 0; got {self.appended!r:.60}"
            )
        object.__setattr__(self, "appended", float(self.appended))

    def __call__(self, rows: int, total_context: float, appended: float | None = None) -> float:
        a = self.appended * rows if appended is None else appended
        return self.pass_s(float(rows)) + self.context_s * total_context + self.append_s * a

    def to_dict(self) -> dict[str, Any]:
        return {
            "knots": list(self.pass_s.knots),
            "pass_s": list(self.pass_s.values),
            "context_s": self.context_s,
            "append_s": self.append_s,
            "appended": self.appended,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: object, where: str) -> DraftTerm:
        d = _only(data, ("knots", "pass_s", "context_s", "append_s", "appended"), where)
        return cls(
            _curve(d, where),
            _num(d, "context_s", where),
            int(d.get("samples", 0)),
            _num(d, "append_s", where) if "append_s" in d else 0.0,
            _num(d, "appended", where) if "appended" in d else 0.0,
        )


@dataclass(frozen=True)
class HostTerm:
    """Host work of a step outside its draft and verify calls:
    step_s + batched_s·[R ≥ 2] + request_s·R + node_s·ΣN.

    ``batched_s`` is what a step of several requests pays once beyond a single request's: the
    batched code paths (the controllers' joint decision over the batch, the forest) that a
    step of one request does not take — a jump at R = 2 that no slope in R describes."""

    step_s: float
    request_s: float = 0.0
    node_s: float = 0.0
    samples: int = 0
    batched_s: float = 0.0

    def __post_init__(self) -> None:
        _checked(self, ("step_s", "request_s", "node_s", "batched_s"))

    def __call__(self, rows: int, nodes: float) -> float:
        batched = self.batched_s if rows > 1 else 0.0
        return self.step_s + batched + self.request_s * rows + self.node_s * nodes

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_s": self.step_s,
            "request_s": self.request_s,
            "node_s": self.node_s,
            "batched_s": self.batched_s,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: object, where: str) -> HostTerm:
        keys = ("step_s", "request_s", "node_s")
        d = _only(data, (*keys, "batched_s"), where)
        step, request, node = (_num(d, k, where) for k in keys)
        # a truth file written before the term: no jump
        batched = _num(d, "batched_s", where) if "batched_s" in d else 0.0
        return cls(step, request, node, int(d.get("samples", 0)), batched)


@dataclass(frozen=True)
class PrefillTerm:
    """One prompt of n tokens prefilled alone: pass_s + token_s·n + token2_s·n²."""

    pass_s: float
    token_s: float = 0.0
    token2_s: float = 0.0
    samples: int = 0

    def __post_init__(self) -> None:
        _checked(self, ("pass_s", "token_s", "token2_s"))

    def __call__(self, tokens: float) -> float:
        n = float(tokens)
        return self.pass_s + self.token_s * n + self.token2_s * n * n

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass_s": self.pass_s,
            "token_s": self.token_s,
            "token2_s": self.token2_s,
            "samples": self.samples,
        }

    @classmethod
    def from_dict(cls, data: object, where: str) -> PrefillTerm:
        keys = ("pass_s", "token_s", "token2_s")
        d = _only(data, keys, where)
        base, token, token2 = (_num(d, k, where) for k in keys)
        return cls(base, token, token2, int(d.get("samples", 0)))


@public
@dataclass(frozen=True)
class MeasuredCosts:
    """Every term of a measured truth (see the module docstring)."""

    verify: Mapping[str, VerifyTerm]
    draft: Mapping[str, DraftTerm]
    host: Mapping[str, HostTerm]
    loop: Mapping[str, HostTerm]
    prefill: PrefillTerm
    noise: float = 0.0  # robust σ of the verify passes' log residuals around the fit
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, kind in (
            ("verify", VerifyTerm),
            ("draft", DraftTerm),
            ("host", HostTerm),
            ("loop", HostTerm),
        ):
            table = getattr(self, name)
            if not isinstance(table, Mapping) or not all(
                isinstance(k, str) and isinstance(v, kind) for k, v in table.items()
            ):
                raise ConfigError(
                    f"MeasuredCosts.{name} must map names to {kind.__name__}; got {table!r:.60}"
                )
        if not isinstance(self.prefill, PrefillTerm):
            raise ConfigError(
                f"MeasuredCosts.prefill must be a PrefillTerm; got {self.prefill!r:.60}"
            )
        if isinstance(self.noise, bool) or not isinstance(self.noise, int | float):
            raise ConfigError(f"MeasuredCosts.noise must be a number ≥ 0; got {self.noise!r:.60}")
        if not (_finite(self.noise) and self.noise >= 0):
            raise ConfigError(f"MeasuredCosts.noise must be finite and ≥ 0; got {self.noise!r}")
        if not isinstance(self.meta, Mapping):
            raise ConfigError(f"MeasuredCosts.meta must be a mapping; got {self.meta!r:.60}")
        missing = [k for k in KINDS if k not in self.verify]
        missing += [f"draft.{p}" for p in ("argmax", "topk") if p not in self.draft]
        missing += [f"host.{k}_static" for k in KINDS if f"{k}_static" not in self.host]
        missing += [f"loop.{k}_static" for k in KINDS if f"{k}_static" not in self.loop]
        if missing:
            raise ConfigError(
                f"a measured truth needs every step kind measured; missing: {', '.join(missing)} "
                "(measure with the policies ar, chain and a tree policy, e.g. fixed:16)"
            )
        verify_keys = {*KINDS, *(f"{k}_{s}" for k in KINDS for s in _STAGE_TERMS)}
        unknown = sorted(set(self.verify) - verify_keys) + sorted(
            set(self.draft) - {"argmax", "topk"}
        )
        keys = {f"{k}_{c}" for k in (*KINDS, *BUILDERS[1:]) for c in CONTROLS}
        unknown += sorted(set(self.host) - keys) + sorted(set(self.loop) - keys)
        if unknown:
            raise ConfigError(f"a measured truth has unknown terms: {', '.join(unknown)}")

    # -- pricing -------------------------------------------------------------------------

    def verify_s(self, kind: str, sizes: Sequence[int], contexts: Sequence[int]) -> float:
        """The verifier's call for one batched step of ``kind``: the padded pass, and its
        masks, acceptance walk and commit where they were measured apart."""
        if not len(sizes):
            raise ConfigError("a pass needs at least one request")
        n = 1 if kind == "ar" else int(max(sizes))
        rows, context = len(sizes), int(max(contexts))
        total = self.verify[kind](rows, n, context)
        for stage in _STAGE_TERMS:
            term = self.verify.get(f"{kind}_{stage}")
            if term is not None:
                total += term(rows, n, context)
        return total

    def draft_s(
        self, preparation: str, contexts: Sequence[int], appended: float | None = None
    ) -> float:
        """The drafter's pass over a batch; ``appended``: the target features its requests'
        contexts take first, summed (None: the term's mean per request)."""
        if not len(contexts):
            raise ConfigError("a pass needs at least one request")
        return self.draft[preparation](len(contexts), float(sum(contexts)), appended)

    def host_s(
        self, kind: str, control: str, sizes: Sequence[int], builder: str = ""
    ) -> tuple[float, float]:
        """(build, loop) host seconds of a step of ``kind`` decided as ``control``; a tree step
        of a policy with its own ``builder`` (beam, eagle) is priced by that builder's terms
        where they were measured."""
        out = []
        names = (builder, kind) if builder and kind == "tree" else (kind,)
        for table in (self.host, self.loop):
            for name, c in ((n, c) for n in names for c in _FALLBACK[control]):
                term = table.get(f"{name}_{c}")
                if term is not None:
                    out.append(term(len(sizes), float(sum(sizes))))
                    break
            else:  # pragma: no cover - __post_init__ requires the static terms
                raise ConfigError(f"internal: no host term for {kind}")
        return out[0], out[1]

    def prefill_s(self, tokens: Sequence[float], contexts: Sequence[float]) -> float:
        """Chunks prefilled one by one: chunk j of tokens[j] new tokens over contexts[j] cached
        ones as prefill(c + n) − prefill(c) (a whole prompt: prefill(n))."""
        total = 0.0
        for n, c in zip(tokens, contexts, strict=True):
            total += self.prefill(c + n) - (self.prefill(c) if c > 0 else 0.0)
        return total

    def step_s(self, sample: StepSample) -> float:
        """What this truth says ``sample``'s whole step costs (draft, host, loop, verify)."""
        kind, sizes, ctx = sample.kind, sample.sizes, sample.contexts
        draft = (
            0.0
            if kind == "ar"
            else self.draft_s(
                "topk" if sample.preparation == "topk" else "argmax",
                ctx,
                sample.appended if sample.appended > 0 else None,  # 0: not recorded
            )
        )
        build, loop = self.host_s(kind, sample.control, sizes, sample.builder)
        return draft + build + loop + self.verify_s(kind, sizes, ctx)

    def scaled(self, factor: float) -> MeasuredCosts:
        """This truth on a machine ``factor`` times as slow: every term × ``factor``."""
        if (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not (_finite(factor) and float(factor) > 0)
        ):
            raise ConfigError(f"a speed factor must be a finite number > 0; got {factor!r:.40}")
        f = float(factor)

        def curve(c: Curve) -> Curve:
            return Curve(c.knots, tuple(v * f for v in c.values))

        def host(t: HostTerm) -> HostTerm:
            return HostTerm(t.step_s * f, t.request_s * f, t.node_s * f, t.samples, t.batched_s * f)

        return dataclasses.replace(
            self,
            verify={
                k: VerifyTerm(
                    curve(t.pass_s), t.row_s * f, t.attention_s * f, t.cache_s * f, t.samples
                )
                for k, t in self.verify.items()
            },
            draft={
                k: DraftTerm(
                    curve(t.pass_s), t.context_s * f, t.samples, t.append_s * f, t.appended
                )
                for k, t in self.draft.items()
            },
            host={k: host(t) for k, t in self.host.items()},
            loop={k: host(t) for k, t in self.loop.items()},
            prefill=PrefillTerm(
                self.prefill.pass_s * f,
                self.prefill.token_s * f,
                self.prefill.token2_s * f,
                self.prefill.samples,
            ),
        )

    # -- files ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            **dict(self.meta),
            "noise": self.noise,
            "verify": {k: v.to_dict() for k, v in self.verify.items()},
            "draft": {k: v.to_dict() for k, v in self.draft.items()},
            "host": {k: v.to_dict() for k, v in self.host.items()},
            "loop": {k: v.to_dict() for k, v in self.loop.items()},
            "prefill": self.prefill.to_dict(),
        }


_META = ("origin", "device", "steps", "prefills", "seconds", "stall_share")


@public
def measured_from_dict(data: object, origin: str = "<dict>") -> MeasuredCosts:
    """A validated :class:`MeasuredCosts` from a truth file's ``[measured]`` table."""
    where = f"{origin}: [measured]"
    d = _only(data, ("noise", "verify", "draft", "host", "loop", "prefill", *_META), where)
    meta: dict[str, Any] = {}
    for key in _META:
        if key in d:
            value = d[key]
            ok = (
                isinstance(value, str)
                if key in ("origin", "device")
                else (isinstance(value, int | float) and not isinstance(value, bool) and value >= 0)
            )
            if not ok:
                raise ConfigError(f"{where}: '{key}' has a wrong type or value: {value!r}")
            meta[key] = value
    for section in ("verify", "draft", "host", "loop", "prefill"):
        if not isinstance(d.get(section), Mapping):
            raise ConfigError(f"{where}: needs a [measured.{section}] table")
    return MeasuredCosts(
        verify={
            str(k): VerifyTerm.from_dict(v, f"{where}.verify.{k}") for k, v in d["verify"].items()
        },
        draft={str(k): DraftTerm.from_dict(v, f"{where}.draft.{k}") for k, v in d["draft"].items()},
        host={str(k): HostTerm.from_dict(v, f"{where}.host.{k}") for k, v in d["host"].items()},
        loop={str(k): HostTerm.from_dict(v, f"{where}.loop.{k}") for k, v in d["loop"].items()},
        prefill=PrefillTerm.from_dict(d["prefill"], f"{where}.prefill"),
        noise=_num(d, "noise", where) if "noise" in d else 0.0,
        meta=meta,
    )
