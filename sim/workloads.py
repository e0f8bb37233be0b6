"""Synthetic workloads: drafter marginals and the target's tokens, with tunable alignment.

A synthetic request is a stream of speculative steps. At each step the drafter proposes a row of
top-K marginals q_k for each of ``depth`` future positions, and the target's token at each of
those positions is drawn *relative to the drafter's row*:

    P(target token = the drafter's rank-r candidate at position k) = λ · q_k[r],
    P(target token is outside the drafter's top-K)                 = 1 − λ · Σ_r q_k[r].

λ (``alignment``) is the miscalibration knob: λ = 1 is a perfectly calibrated drafter (the
self-verification model of Prop. 3.2, where Â is exact), λ < 1 an over-confident one. The
drafter's rows are shaped by the top-1 confidence at position 1 (``top1``), its decay per
position (``decay``), how the remaining mass spreads over the runners-up (``concentration``, a
Dirichlet parameter: small = peaky, large = flat, i.e. the entropy knob), and a per-request
difficulty (a normal shift of the top-1 log-odds with standard deviation ``difficulty_sd``).

Temperature: at T > 0 the target samples, so it agrees less with any fixed proposal; the model
multiplies λ by ``exp(−temperature_penalty · T)``. Otherwise T = 0 and T > 0 are treated alike:
each step draws the target's tokens afresh relative to that step's rows, which is exactly the
acceptance law of sample-and-match verification under this model. (Exact replay of a fixed
target sequence is what traces are for; see sim.replay.)

The presets ``math``, ``code`` and ``chat`` are set so that the DFlash chain (block 16) reaches
the acceptance lengths the paper and DFlash report on Qwen3-8B — chain τ ≈ 6.5 on math, ≈ 5.5
on code, ≈ 3.5 on chat — see docs/simulator.md for how they were tuned and what they give.

What this module does not do: draw the streams (sim.synthetic does, for a whole batch at once),
time anything (sim.gpu) or run policies (the engine does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError, UnknownNameError

__all__ = ["PRESETS", "Workload", "get_workload"]


@dataclass(frozen=True)
class Workload:
    """Parameters of a synthetic drafter–target pair on one kind of task.

    Lengths. ``prompt_len`` and ``output_len`` are the medians of log-normal length
    distributions: a request's length is ``round(median · exp(σ·Z))`` with Z standard normal,
    clipped to [1, ``*_len_max``] (see :meth:`sample_lengths`). σ = 0 (the default) gives every
    request exactly the median. The presets' σ and clip values are assumptions chosen to give
    plausible shapes (math and code prompts shorter-tailed than chat, chat spread like
    ShareGPT-style conversations), not measurements of any dataset.
    """

    name: str
    top1: float  # drafter's mean top-1 probability at position 1
    decay: float  # multiplicative decay of top-1 confidence per position
    concentration: float  # Dirichlet parameter of the runner-up mass (entropy knob)
    alignment: float  # λ: target agreement per unit of drafter probability
    difficulty_sd: float = 0.5  # per-request spread of the top-1 log-odds
    temperature_penalty: float = 0.08  # λ_T = λ · exp(−penalty · T)
    tail_alpha: float = 2.0  # Dirichlet weight of the mass outside the top-K
    output_len: int = 512  # tokens generated per request (the median when sampled)
    prompt_len: int = 256  # context before the first step (the median when sampled)
    depth: int = 15  # drafted positions per step (block size 16 → 15)
    k: int = 16  # candidates kept per position
    prompt_len_sigma: float = 0.0  # σ of the log-normal prompt length around its median (0: fixed)
    output_len_sigma: float = 0.0  # σ of the log-normal output length around its median
    prompt_len_max: int = 32_768  # sampled prompt lengths are clipped to this
    output_len_max: int = 32_768  # sampled output lengths are clipped to this

    MAX_TOKENS = 1_000_000  # (not a field) no prompt or output may be longer than this

    def __post_init__(self) -> None:
        top = self.MAX_TOKENS

        def whole(value: object, low: int, high: int) -> bool:
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                return False
            return low <= int(value) <= high

        prompt_ok = whole(self.prompt_len, 1, top)
        output_ok = whole(self.output_len, 1, top)

        checks = {
            "top1": (0 < self.top1 < 1, "0 < top1 < 1"),
            "decay": (0 < self.decay <= 1, "0 < decay ≤ 1"),
            "concentration": (self.concentration > 0, "> 0"),
            "alignment": (0 < self.alignment <= 1, "0 < alignment ≤ 1"),
            "difficulty_sd": (self.difficulty_sd >= 0, "≥ 0"),
            "temperature_penalty": (self.temperature_penalty >= 0, "≥ 0"),
            "tail_alpha": (self.tail_alpha > 0, "> 0"),
            "output_len": (output_ok, f"an integer in 1 … {top}"),
            "prompt_len": (prompt_ok, f"an integer in 1 … {top}"),
            "depth": (self.depth >= 1, "≥ 1"),
            "k": (self.k >= 1, "≥ 1"),
            "prompt_len_sigma": (0 <= self.prompt_len_sigma < math.inf, "a finite number ≥ 0"),
            "output_len_sigma": (0 <= self.output_len_sigma < math.inf, "a finite number ≥ 0"),
            "prompt_len_max": (
                whole(self.prompt_len_max, self.prompt_len if prompt_ok else 1, top),
                f"an integer in prompt_len ({self.prompt_len!r}) … {top}",
            ),
            "output_len_max": (
                whole(self.output_len_max, self.output_len if output_ok else 1, top),
                f"an integer in output_len ({self.output_len!r}) … {top}",
            ),
        }
        bad = [(name, accepted) for name, (ok, accepted) in checks.items() if not ok]
        if bad:
            values = "; ".join(f"{b}={getattr(self, b)!r} (accepted: {a})" for b, a in bad)
            raise ConfigError(f"workload {self.name!r} has out-of-range parameters: {values}")

    def with_(self, **changes: object) -> Workload:
        return replace(self, **changes)  # type: ignore[arg-type]

    def sample_lengths(
        self, rng: np.random.Generator, n: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Prompt and output lengths of ``n`` requests: two int64 arrays, each in [1, max].

        Draws one standard-normal matrix of shape (2, n) — prompts in row 0, outputs in row 1 —
        whatever the σ, so that a given generator state gives the same output lengths whether or
        not the prompts are spread. Length = clip(round(median · exp(σ·Z)), 1, ``*_len_max``).
        """
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ConfigError(f"sample_lengths needs a whole number n ≥ 0 of requests; got {n!r}")
        z = rng.standard_normal((2, int(n)))
        out = []
        for row, median, sigma, high in (
            (0, self.prompt_len, self.prompt_len_sigma, self.prompt_len_max),
            (1, self.output_len, self.output_len_sigma, self.output_len_max),
        ):
            lengths = np.rint(median * np.exp(sigma * z[row]))
            out.append(np.clip(lengths, 1, high).astype(np.int64))
        return out[0], out[1]


# Length distributions of the presets (assumptions, see Workload): math and code prompts are
# short with a modest spread, chat prompts spread over more than an order of magnitude; the clip
# values are context budgets a server would enforce.
PRESETS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "math",
            top1=0.93,
            decay=0.985,
            concentration=0.4,
            alignment=0.97,
            prompt_len_sigma=0.4,
            output_len_sigma=0.5,
            prompt_len_max=4096,
            output_len_max=8192,
        ),
        Workload(
            "code",
            top1=0.91,
            decay=0.98,
            concentration=0.5,
            alignment=0.96,
            prompt_len_sigma=0.6,
            output_len_sigma=0.6,
            prompt_len_max=8192,
            output_len_max=8192,
        ),
        Workload(
            "chat",
            top1=0.80,
            decay=0.97,
            concentration=0.8,
            alignment=0.93,
            prompt_len_sigma=1.0,
            output_len_sigma=0.8,
            prompt_len_max=16384,
            output_len_max=8192,
        ),
    )
}


def get_workload(name: str) -> Workload:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownNameError(
            f"unknown workload {name!r}; known: {', '.join(sorted(PRESETS))} (or a trace path)"
        ) from None
