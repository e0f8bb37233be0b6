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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bastion.errors import BastionError, ConfigError
from bastion.files import read_json_file, write_text_atomic
from bastion.guard import public, writable_file
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


@public(path=writable_file)
def write_trace(path: str | os.PathLike[str], trace: Trace) -> None:
    """Write ``trace`` as JSON atomically: a failed write leaves no file at ``path``."""
    write_text_atomic(path, json.dumps(_to_json(trace)))


_MAX_ID = 2**63 - 1


def _int(value: Any, name: str, origin: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= _MAX_ID:
        raise ConfigError(
            f"{origin}: trace field {name} must be an integer in [{minimum}, 2**63), got "
            f"{str(value)[:40]!r}"
        )
    return value


def _ints(value: Any, name: str, origin: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(
            f"{origin}: trace field {name} must be a list of token ids (integers ≥ 0)"
        )
    return tuple(_int(x, f"{name}[{i}]", origin) for i, x in enumerate(value))


def _marginals(s: Any, where: str, origin: str) -> DraftMarginals:
    for key in ("token_ids", "probs"):
        if key not in s:
            raise ConfigError(f"{origin}: {where} lacks field {key!r}")
    try:
        return DraftMarginals(s["token_ids"], s["probs"])
    except BastionError as exc:
        raise ConfigError(f"{origin}: {where}: {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # ragged or non-numeric rows
        raise ConfigError(
            f"{origin}: {where}: token_ids/probs are not numeric [depth][K] rows ({exc})"
        ) from None


@public
def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a trace written by :func:`write_trace`; anything malformed is a
    :class:`ConfigError` naming the file and the field."""
    origin = str(path)
    try:
        data = read_json_file(path, "trace")
    except ConfigError as exc:
        raise ConfigError(f"cannot read trace: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise ConfigError(f'{path} is not a {TRACE_FORMAT} file (no "format": "{TRACE_FORMAT}")')
    if data.get("version") != TRACE_VERSION:
        raise ConfigError(f"{path}: trace version {data.get('version')!r}; known: {TRACE_VERSION}")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        raise ConfigError(f"{origin}: trace field steps must be a list of step objects")
    steps = []
    for i, s in enumerate(raw_steps):
        where = f"steps[{i}]"
        if not isinstance(s, dict):
            raise ConfigError(f"{origin}: {where} must be an object")
        for key in ("position", "tree_size", "committed"):
            if key not in s:
                raise ConfigError(f"{origin}: {where} lacks field {key!r}")
        steps.append(
            TraceStep(
                _int(s["position"], f"{where}.position", origin),
                _marginals(s, where, origin),
                _int(s["tree_size"], f"{where}.tree_size", origin, minimum=1),
                _int(s["committed"], f"{where}.committed", origin, minimum=1),
            )
        )
    raw_dense = data.get("dense") or []
    if not isinstance(raw_dense, list):
        raise ConfigError(f"{origin}: trace field dense must be a list")
    dense = {}
    for i, d in enumerate(raw_dense):
        where = f"dense[{i}]"
        if not isinstance(d, dict) or "position" not in d:
            raise ConfigError(f"{origin}: {where} must be an object with a position")
        dense[_int(d["position"], f"{where}.position", origin)] = _marginals(d, where, origin)
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ConfigError(f"{origin}: trace field metadata must be an object")
    return Trace(
        _ints(data.get("prompt_ids"), "prompt_ids", origin),
        _ints(data.get("output_ids"), "output_ids", origin),
        tuple(steps),
        metadata,
        dense,
    )
