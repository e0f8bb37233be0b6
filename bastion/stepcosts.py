"""What a real decode step spent, stage by stage: the samples a measured truth is fitted from.

The real backend's decode loop (:mod:`bastion.backends.torch.decode`) times every batched step in
four parts and every prefill whole:

- ``draft_s``: the engine's plan and the drafter's batched pass (0 for a step that drafts
  nothing);
- ``build_s``: the tree policy or controller choosing every request's tree (best-first growth,
  the controller's decision, the chain's argmax path);
- ``verify_s``: the verifier's whole call — masks and positions, the target's forward pass, the
  acceptance walk and the KV compaction; where the verifier times its stages, also split into
  ``mask_s`` (masks and positions), ``forward_s`` (the target's pass), ``accept_s`` (the
  acceptance walks) and ``commit_s`` (the rest of the call: KV compaction, the drafter's
  features, bookkeeping), which add up to ``verify_s``;
- ``other_s``: the rest of the step's wall time — the learning controller's update after the
  pass, the loop's bookkeeping and the next step's request arrays.

A :class:`StepSample` keeps them with what determines them: the step's kind (``"ar"``,
``"chain"``, ``"tree"``), what its drafter output needed (``"none"``, ``"argmax"``, ``"topk"``),
whether a controller decided it (``"static"``, ``"decide"``, ``"repeat"``: a step that repeated
the learning controller's last decision), and every request's tree size and context. A
:class:`PrefillSample` is one prompt's prefill. :mod:`bastion.sim.measured_fit` fits a truth
(:mod:`bastion.sim.measured`) from them.

What this module does not do: time anything (the runner does) or fit
(:mod:`bastion.sim.measured_fit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.errors import ConfigError

__all__ = [
    "BUILDERS",
    "CONTROLS",
    "KINDS",
    "PREPARATIONS",
    "STAGES",
    "PrefillSample",
    "StepSample",
]

KINDS = ("ar", "chain", "tree")
BUILDERS = ("", "beam", "eagle")  # a tree policy's own builder ("": best-first)
STAGES = ("mask_s", "forward_s", "accept_s", "commit_s")  # the verifier's call, split
PREPARATIONS = ("none", "argmax", "topk")
CONTROLS = ("static", "decide", "repeat")


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds; got {value!r}")
    try:
        v = float(value)
    except OverflowError:
        raise ConfigError(
            f"{name} must be a finite number of seconds; got an int too large for a float"
        ) from None
    if not (math.isfinite(v) and v >= 0):
        raise ConfigError(f"{name} must be a finite number of seconds ≥ 0; got {value!r}")
    return v


def _counts(values: object, name: str, least: int) -> tuple[int, ...]:
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise ConfigError(f"{name} must be a list of whole numbers; got {values!r}")
    out = []
    for v in values:  # a str, bytes or non-iterable was refused above
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ConfigError(f"{name} must hold whole numbers ≥ {least}; got {v!r}")
        out.append(int(v))
    return tuple(out)


@dataclass(frozen=True)
class StepSample:
    """One measured batched step (seconds; one size and context per request of the step)."""

    kind: str
    preparation: str
    control: str
    sizes: tuple[int, ...]
    contexts: tuple[int, ...]
    draft_s: float
    build_s: float
    verify_s: float
    other_s: float
    builder: str = ""  # the tree policy's own builder (BUILDERS; "": best-first or none)
    # the verifier's stages (sum: verify_s), where it times them; all 0 where it does not
    mask_s: float = 0.0
    forward_s: float = 0.0
    accept_s: float = 0.0
    commit_s: float = 0.0
    run: int = 0  # which timed run of its session the step belongs to (0: the first)
    at: float = 0.0  # when it began, on the machine's monotonic clock (s; 0: not recorded)
    # target features the drafter appended to the requests' contexts before its pass, summed
    # over them: the tokens committed since each last drafted (0: no draft, or not recorded)
    appended: int = 0

    def __post_init__(self) -> None:
        for name, value, accepted in (
            ("kind", self.kind, KINDS),
            ("preparation", self.preparation, PREPARATIONS),
            ("control", self.control, CONTROLS),
            ("builder", self.builder, BUILDERS),
        ):
            if not isinstance(value, str) or value not in accepted:
                raise ConfigError(
                    f"step sample {name} {value!r:.60}; accepted: {', '.join(accepted)}"
                )
        sizes = _counts(self.sizes, "step sample sizes", 1)
        contexts = _counts(self.contexts, "step sample contexts", 0)
        if not sizes or len(sizes) != len(contexts):
            raise ConfigError(
                f"a step sample needs one size and one context per request (≥ 1 request); got "
                f"{len(sizes)} sizes and {len(contexts)} contexts"
            )
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "contexts", contexts)
        for name in ("draft_s", "build_s", "verify_s", "other_s", *STAGES):
            object.__setattr__(self, name, _seconds(getattr(self, name), f"step sample {name}"))
        if isinstance(self.run, bool) or not isinstance(self.run, int) or self.run < 0:
            raise ConfigError(f"step sample run must be a whole number ≥ 0; got {self.run!r:.40}")
        object.__setattr__(self, "at", _seconds(self.at, "step sample at"))
        a = self.appended
        if isinstance(a, bool) or not isinstance(a, int) or a < 0:
            raise ConfigError(f"step sample appended must be a whole number ≥ 0; got {a!r:.40}")
        staged = sum(getattr(self, name) for name in STAGES)
        if staged > 0 and abs(staged - self.verify_s) > 1e-6 + 1e-3 * self.verify_s:
            raise ConfigError(
                f"a step sample's verifier stages add up to {staged!r} s, not its verify_s "
                f"{self.verify_s!r} s"
            )

    @property
    def staged(self) -> bool:
        """Whether the verifier's stages were timed."""
        return self.forward_s > 0

    @property
    def rows(self) -> int:
        """Requests in the step (rows of the batched pass)."""
        return len(self.sizes)

    @property
    def host_s(self) -> float:
        """The step's host work outside the draft and verify calls: build + other."""
        return self.build_s + self.other_s

    @property
    def cycle_s(self) -> float:
        return self.draft_s + self.build_s + self.verify_s + self.other_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "preparation": self.preparation,
            "control": self.control,
            "sizes": list(self.sizes),
            "contexts": list(self.contexts),
            "draft_s": self.draft_s,
            "build_s": self.build_s,
            "verify_s": self.verify_s,
            "other_s": self.other_s,
            "builder": self.builder,
            **{name: getattr(self, name) for name in STAGES},
            "run": self.run,
            "at": self.at,
            "appended": self.appended,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepSample:
        if not isinstance(data, Mapping):
            raise ConfigError(f"a step sample must be an object; got {data!r:.80}")
        keys = {"kind", "preparation", "control", "sizes", "contexts"}
        keys |= {"draft_s", "build_s", "verify_s", "other_s"}
        if not keys <= set(data) <= keys | {"builder", "run", "at", "appended", *STAGES}:
            raise ConfigError(
                f"a step sample needs the keys {sorted(keys)} (and optionally 'builder', "
                f"'run', 'at', 'appended', {', '.join(STAGES)})"
            )
        return cls(**data)


@dataclass(frozen=True)
class PrefillSample:
    """One prompt's prefill: its length in tokens and the seconds it took."""

    tokens: int
    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise ConfigError(f"a prefill sample needs tokens ≥ 1; got {self.tokens!r}")
        object.__setattr__(self, "seconds", _seconds(self.seconds, "prefill sample seconds"))
