"""Trace replay: evaluate any policy offline on a run recorded by the real backend.

A trace (``bastion/trace.py``, docs/trace-format.md) holds the target's tokens and the drafter's
top-K marginals at the roots of recorded steps. At T = 0 the target's output is fixed, so at a
root with recorded marginals any policy's acceptance follows exactly: walk its tree against the
recorded continuation (DESIGN.md, decision 2). A policy whose steps start at positions the trace
has no marginals for cannot be replayed exactly; that is an error naming the position. A *dense*
trace (``bastion generate --record-trace PATH --dense-trace``) holds marginals at every position
and replays any policy.

Traces recorded at T > 0 replay the recorded sample path: exact for the recorded policy, an
approximation for others.

What this module does not do: record traces (the real backend does) or time anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bastion.errors import ConfigError
from bastion.trace import Trace, read_trace
from bastion.tree import DraftMarginals

__all__ = ["TraceRequest", "load_traces", "replay_factory"]


class TraceRequest:
    """A ``SimRequest`` that replays one recorded request."""

    def __init__(self, trace: Trace, request_id: int = 0, origin: str = "<trace>") -> None:
        self.trace = trace
        self.origin = origin
        self.request_id = request_id
        self.sequence = np.array((*trace.prompt_ids, *trace.output_ids), dtype=np.int64)
        self.context_len = len(trace.prompt_ids)  # the root is output_ids[0]
        self.generated = 1
        self.output_len = len(trace.output_ids)
        # the run's own marginals at its roots win over the dense recording's at the same spot
        self.marginals = {**trace.dense, **{s.position: s.marginals for s in trace.steps}}
        self._target = np.empty(0, dtype=np.int64)

    def draft(self) -> DraftMarginals:
        root = self.context_len
        m = self.marginals.get(root)
        if m is None:
            raise ConfigError(
                f"{self.origin}: no drafter marginals at position {root}; this trace can replay "
                f"only policies whose steps start where the recorded run's did (recorded policy: "
                f"{self.trace.metadata.get('policy', 'unknown')})"
            )
        rows = self.sequence[root + 1 : root + 1 + m.depth]
        self._target = np.concatenate((rows, np.full(m.depth - rows.size, -1, dtype=np.int64)))
        return m

    def target_tokens(self) -> npt.NDArray[np.int64]:
        return self._target

    def bonus(self, accepted: int) -> int:
        idx = self.context_len + 1 + accepted
        return int(self.sequence[idx]) if idx < self.sequence.size else -1

    def commit(self, n: int) -> None:
        self.context_len += n
        self.generated += n


def _check(trace: Trace, origin: str) -> None:
    """Consistency checks that a reader alone cannot make."""
    if not trace.output_ids:
        raise ConfigError(f"{origin}: the trace has no output tokens")
    if not trace.steps and not trace.dense and len(trace.output_ids) > 1:
        raise ConfigError(f"{origin}: the trace has output tokens but no recorded steps")
    n = len(trace.prompt_ids) + len(trace.output_ids)
    vocab = trace.metadata.get("vocab_size")
    shapes = {s.marginals.probs.shape for s in trace.steps}
    shapes |= {m.probs.shape for m in trace.dense.values()}
    if len(shapes) > 1:
        raise ConfigError(f"{origin}: steps disagree on the marginals' shape: {sorted(shapes)}")
    last = -1
    for s in trace.steps:
        if not len(trace.prompt_ids) <= s.position < n:
            raise ConfigError(
                f"{origin}: step position {s.position} is outside the output "
                f"[{len(trace.prompt_ids)}, {n})"
            )
        if s.position <= last:
            raise ConfigError(f"{origin}: step positions must increase ({last} then {s.position})")
        last = s.position
        if vocab is not None and int(s.marginals.token_ids.max()) >= int(vocab):
            raise ConfigError(
                f"{origin}: a drafter token id {int(s.marginals.token_ids.max())} is outside the "
                f"vocabulary of {vocab} in its metadata"
            )
    for pos, m in trace.dense.items():
        if not len(trace.prompt_ids) <= pos < n:
            raise ConfigError(f"{origin}: dense position {pos} is outside the output")
        if vocab is not None and int(m.token_ids.max()) >= int(vocab):
            raise ConfigError(f"{origin}: a drafter token id is outside the vocabulary of {vocab}")
    if vocab is not None and max(trace.output_ids) >= int(vocab):
        raise ConfigError(f"{origin}: an output token id is outside the vocabulary of {vocab}")


def load_traces(path: Path) -> list[tuple[Trace, str]]:
    """Every ``*.json`` trace at ``path`` (a file or a directory), checked for consistency."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise ConfigError(f"no trace files at {path}")
    traces = []
    for f in files:
        t = read_trace(f)
        _check(t, str(f))
        traces.append((t, str(f)))
    vocab = {str(t.metadata["vocab_size"]) for t, _ in traces if "vocab_size" in t.metadata}
    if len(vocab) > 1:
        raise ConfigError(f"traces at {path} come from different vocabularies: {sorted(vocab)}")
    return traces


def replay_factory(path: Path, seed: int = 0) -> Callable[[int], TraceRequest]:
    """Request i replays trace i mod (number of traces) under ``path``."""
    traces = load_traces(path)
    del seed  # replay is deterministic; the argument keeps the factories interchangeable

    def make(index: int) -> TraceRequest:
        trace, origin = traces[index % len(traces)]
        return TraceRequest(trace, request_id=index, origin=origin)

    return make
