"""Service-level objectives and the serving loop's memory figures, as record fields.

An SLO bounds a request's latency: ``slo_ttft_s`` its time to first token, ``slo_tpot_s`` its
time per output token after the first (the definitions of :mod:`bastion.sim.latency`). A request
*meets* the SLOs when it meets every one given. Per run:

- ``slo_attainment``: the share of requests that meet them (AdaSpec's and SpecServe's measure);
- ``goodput_rps``: requests that meet them per simulated second of the run (DistServe's
  goodput), over the run's simulated time (first arrival to last commit).

Without an SLO both are NaN (null in JSON): there is nothing to attain.

The memory figures come from the server's KV cache (:mod:`bastion.sim.memory`): its capacity
in tokens (None without a memory limit), the most token slots held at once (trees' slots during
verification included), the most requests admitted at once, the preemptions, and the time
requests waited for admission (p50 and p99 over requests; a preempted request's waits add up).

What this module does not do: serve or time anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bastion.errors import ConfigError
from bastion.guard import public
from bastion.sim.serving_records import ServingResult

__all__ = ["check_slo", "memory_fields", "slo_fields"]


@public
def check_slo(name: str, value: float | None) -> None:
    """Refuse an SLO that is not a finite number of seconds > 0 (None: no such SLO)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"{name} must be a finite number of seconds > 0; got {value!r}")


@public
def slo_fields(
    ttft_s: Sequence[float],
    tpot_s: Sequence[float],
    elapsed_s: float,
    slo_ttft_s: float | None,
    slo_tpot_s: float | None,
) -> dict[str, Any]:
    """``slo_attainment`` and ``goodput_rps`` of requests with these TTFTs and TPOTs."""
    check_slo("slo_ttft_s", slo_ttft_s)
    check_slo("slo_tpot_s", slo_tpot_s)
    if len(ttft_s) != len(tpot_s):
        raise ConfigError(f"{len(ttft_s)} TTFTs but {len(tpot_s)} TPOTs")
    if slo_ttft_s is None and slo_tpot_s is None:
        return {"slo_attainment": float("nan"), "goodput_rps": float("nan")}
    met = np.ones(len(ttft_s), bool)
    if slo_ttft_s is not None:
        met &= np.asarray(ttft_s, float) <= slo_ttft_s
    if slo_tpot_s is not None:
        met &= np.asarray(tpot_s, float) <= slo_tpot_s
    good = int(met.sum())
    return {
        "slo_attainment": good / len(met) if len(met) else float("nan"),
        "goodput_rps": good / elapsed_s if elapsed_s > 0 else float("nan"),
    }


@public
def memory_fields(result: ServingResult) -> dict[str, Any]:
    """The KV-cache figures of a :class:`bastion.sim.serving.ServingResult`."""
    queue = np.asarray([r.queue_s for r in result.requests], float)
    p50, p99 = np.percentile(queue, [50.0, 99.0]) if queue.size else (0.0, 0.0)
    return {
        "kv_capacity_tokens": result.kv_capacity_tokens,
        "kv_peak_tokens": result.kv_peak_tokens,
        "max_running": result.max_running,
        "preemptions": result.preemptions,
        "queue_delay_p50_s": float(p50),
        "queue_delay_p99_s": float(p99),
    }
