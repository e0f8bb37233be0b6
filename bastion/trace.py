"""Run traces: what the real backend records so the simulator can replay policies offline.

A trace is one JSON file (UTF-8) describing one request::

    {
      "format": "bastion-trace", "version": 1,
      "metadata": {"target": ..., "drafter": ..., "policy": ..., "temperature": ...,
                   "prompt_id": ..., "seed": ..., ...},
      "prompt_ids": [int, ...],          # the prompt
      "output_ids": [int, ...],          # the target's generated tokens (first token included)
      "steps": [                          # one per speculative step, in order
        {"position": int,                 # sequence index (prompt + output) of the step's root
         "token_ids": [[int, ...], ...],  # drafter top-K ids [depth][K], rows sorted by prob
         "probs": [[float, ...], ...],    # their marginal probabilities [depth][K]
         "tree_size": int, "committed": int}
      ]
    }

Row k of a step's marginals describes the token at sequence index ``position + 1 + k``. At
T = 0 the target's tokens are fixed, so the marginals at each step's root determine any
policy's acceptance there (exact trace replay). See docs/trace-format.md.

What this module does not do: simulate (the simulator reads traces) or import torch.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bastion.errors import BastionError, ConfigError
from bastion.tree import DraftMarginals

__all__ = ["TRACE_FORMAT", "TRACE_VERSION", "Trace", "TraceStep", "read_trace", "write_trace"]

TRACE_FORMAT = "bastion-trace"
TRACE_VERSION = 1


@dataclass(frozen=True)
class TraceStep:
    """One step: the drafter's marginals at the step's root and what the step committed."""

    position: int  # sequence index of the root (the previous step's bonus token)
    marginals: DraftMarginals
    tree_size: int  # N verified, root included
    committed: int  # tokens committed, bonus included


@dataclass(frozen=True)
class Trace:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    steps: tuple[TraceStep, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # optional: the drafter's marginals at every root position (dense recording), for replaying
    # policies other than the recorded one; keys are sequence indices of roots
    dense: Mapping[int, DraftMarginals] = field(default_factory=dict)


def _to_json(trace: Trace) -> dict[str, Any]:
    return {
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "metadata": dict(trace.metadata),
        "prompt_ids": [int(t) for t in trace.prompt_ids],
        "output_ids": [int(t) for t in trace.output_ids],
        "steps": [
            {
                "position": s.position,
                "token_ids": s.marginals.token_ids.tolist(),
                "probs": s.marginals.probs.tolist(),
                "tree_size": s.tree_size,
                "committed": s.committed,
            }
            for s in trace.steps
        ],
        "dense": [
            {"position": int(pos), "token_ids": m.token_ids.tolist(), "probs": m.probs.tolist()}
            for pos, m in sorted(trace.dense.items())
        ],
    }


def write_trace(path: str | os.PathLike[str], trace: Trace) -> None:
    """Write ``trace`` as JSON atomically: a failed write leaves no file at ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_to_json(trace), f)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _ints(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or not all(isinstance(x, int) for x in value):
        raise ConfigError(f"trace field {name} must be a list of integers")
    return tuple(value)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace written by :func:`write_trace`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise ConfigError(f"{path} is not a {TRACE_FORMAT} file")
    if data.get("version") != TRACE_VERSION:
        raise ConfigError(f"{path}: trace version {data.get('version')}; known: {TRACE_VERSION}")
    try:
        steps = tuple(
            TraceStep(
                int(s["position"]),
                DraftMarginals(s["token_ids"], s["probs"]),
                int(s["tree_size"]),
                int(s["committed"]),
            )
            for s in data["steps"]
        )
        dense = {
            int(d["position"]): DraftMarginals(d["token_ids"], d["probs"])
            for d in data.get("dense") or []
        }
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: malformed step ({exc})") from exc
    except BastionError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    return Trace(
        _ints(data.get("prompt_ids"), "prompt_ids"),
        _ints(data.get("output_ids"), "output_ids"),
        steps,
        dict(data.get("metadata") or {}),
        dense,
    )
