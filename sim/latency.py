"""Per-request latency of a serving run: TTFT, TPOT, end-to-end, their percentiles, a CSV.

For a request that arrives at ``arrival_s``, receives its first output token at
``first_token_s`` (the end of the pass that finished its prefill) and its last at ``finish_s``:

- TTFT (time to first token) = first_token_s − arrival_s, queueing included;
- TPOT (time per output token after the first) = (finish_s − first_token_s) / (output_len − 1),
  0 for a request of one output token (there is no second token to time);
- end-to-end latency = finish_s − arrival_s.

:func:`latency_summary` gives the median and 99th percentile of each (numpy's linear
interpolation); the TPOT percentiles are taken over the requests with ``output_len`` > 1 only
(vLLM's benchmark does the same), 0 when there is none. :func:`write_requests_csv` writes one row
per request, atomically, with the columns of :data:`REQUEST_COLUMNS`.

What this module does not do: measure anything (the serving loop fills the rows).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from bastion.errors import ConfigError
from bastion.guard import public, writable_file
from bastion.sim.results import write_text_atomic

__all__ = ["REQUEST_COLUMNS", "RequestLatency", "latency_summary", "write_requests_csv"]

REQUEST_COLUMNS = (
    "request_id",  # the request's id in the run
    "arrival_s",  # when it reached the server (s from the start of the run)
    "first_token_s",  # when its first output token was produced (end of its prefill)
    "finish_s",  # when its last output token was produced
    "prompt_len",  # prompt tokens
    "output_len",  # output tokens, the first (from the prefill) included
    "steps",  # decode passes (verification or AR steps) the request took part in
    "committed_tokens",  # tokens those passes committed (output_len − 1 when it finished)
    "ttft_s",  # first_token_s − arrival_s
    "tpot_s",  # (finish_s − first_token_s) / (output_len − 1); 0 when output_len ≤ 1
    "e2e_s",  # finish_s − arrival_s
)
"""Columns of :func:`write_requests_csv`, in order (times in seconds, floats at full precision)."""


_NUMBER = {float: (int, float, np.integer, np.floating), int: (int, np.integer)}


@dataclass(frozen=True)
class RequestLatency:
    """The timeline of one served request (times in seconds from the start of the run)."""

    request_id: int
    arrival_s: float
    first_token_s: float
    finish_s: float
    prompt_len: int
    output_len: int
    steps: int
    committed_tokens: int

    def __post_init__(self) -> None:
        for f in fields(self):
            value, kind = getattr(self, f.name), float if f.name.endswith("_s") else int
            ok = not isinstance(value, bool) and isinstance(value, _NUMBER[kind])
            if not ok or (kind is float and abs(value) > 1e300):  # also: no int beyond a float
                raise ConfigError(
                    f"request {self.request_id!r}: {f.name} must be "
                    f"{'a finite number' if kind is float else 'an integer'}; got {value!r:.80}"
                )
        times = (self.arrival_s, self.first_token_s, self.finish_s)
        if not all(math.isfinite(t) for t in times):
            raise ConfigError(f"request {self.request_id}: times must be finite; got {times}")
        if not self.arrival_s <= self.first_token_s <= self.finish_s:
            raise ConfigError(
                f"request {self.request_id}: needs arrival_s ≤ first_token_s ≤ finish_s; "
                f"got {times}"
            )
        if self.prompt_len < 1 or self.output_len < 1:
            raise ConfigError(
                f"request {self.request_id}: prompt_len and output_len must be ≥ 1; got "
                f"{self.prompt_len}, {self.output_len}"
            )
        if self.steps < 0 or self.committed_tokens < 0:
            raise ConfigError(
                f"request {self.request_id}: steps and committed_tokens must be ≥ 0; got "
                f"{self.steps}, {self.committed_tokens}"
            )

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        if self.output_len <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    def row(self) -> dict[str, float | int]:
        """This request as a CSV row (the keys of :data:`REQUEST_COLUMNS`)."""
        return {name: getattr(self, name) for name in REQUEST_COLUMNS}


def _percentiles(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    p50, p99 = np.percentile(np.asarray(values, dtype=np.float64), [50.0, 99.0])
    return float(p50), float(p99)


@public
def latency_summary(rows: Iterable[RequestLatency]) -> dict[str, float]:
    """p50 and p99 of TTFT, TPOT (requests with output_len > 1) and end-to-end latency."""
    rows = list(rows)
    if not rows:
        raise ConfigError("latency_summary needs at least one request")
    out: dict[str, float] = {}
    for name, values in (
        ("ttft", [r.ttft_s for r in rows]),
        ("tpot", [r.tpot_s for r in rows if r.output_len > 1]),
        ("e2e", [r.e2e_s for r in rows]),
    ):
        out[f"{name}_p50_s"], out[f"{name}_p99_s"] = _percentiles(values)
    return out


@public(path=writable_file)
def write_requests_csv(path: str | os.PathLike[str], rows: Iterable[RequestLatency]) -> None:
    """One row per request with the columns of :data:`REQUEST_COLUMNS`, written atomically
    (a header alone when there is no request)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=REQUEST_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(r.row() for r in rows)
    write_text_atomic(Path(path), buf.getvalue())
