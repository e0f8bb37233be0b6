"""Trace replay: evaluate any policy offline on a run recorded by the real backend.

A trace (``bastion/trace.py``, docs/trace-format.md) holds the target's tokens and the drafter's
top-K marginals at the roots of recorded steps. At T = 0 the target's output is fixed, so at a
root with recorded marginals any policy's acceptance follows exactly: walk its tree against the
recorded continuation (exact trace replay). A policy whose steps start at positions the trace
has no marginals for cannot be replayed exactly; that is an error naming the position. A *dense*
trace (``bastion generate --record-trace PATH --dense-trace``) holds marginals at every position
and replays any policy.

Traces recorded at T > 0 replay the recorded sample path: exact for the recorded policy, an
approximation for others.

What this module does not do: record traces (the real backend does) or time anything.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from bastion.batch import BatchMarginals
from bastion.errors import ConfigError
from bastion.guard import public
from bastion.trace import Trace, read_trace

__all__ = ["TraceSource", "load_traces", "trace_source"]


@public
class TraceSource:
    """A :class:`bastion.sim.backend.DraftSource` that replays recorded requests: request i replays
    trace i mod (number of traces); its prompt and output lengths are the trace's."""

    def __init__(self, traces: list[tuple[Trace, str]]) -> None:
        if not traces:
            raise ConfigError("trace replay needs at least one trace")
        self.traces = traces
        sequences = [np.array((*t.prompt_ids, *t.output_ids), dtype=np.int64) for t, _ in traces]
        # the run's own marginals at its roots win over the dense recording's at the same spot
        marginals = [{**t.dense, **{s.position: s.marginals for s in t.steps}} for t, _ in traces]
        self._requests = list(zip(sequences, marginals, traces, strict=True))
        self._slots: dict[int, int] = {}  # slot → trace index

    def lengths(self, index: int, requested: tuple[int, int] | None = None) -> tuple[int, int]:
        del requested  # a replayed request is as long as its recording
        trace = self.traces[index % len(self.traces)][0]
        return len(trace.prompt_ids), len(trace.output_ids)

    def admit(self, slot: int, index: int) -> None:
        self._slots[slot] = index % len(self.traces)

    def draft(
        self, slots: npt.NDArray[np.int64], context_lens: npt.NDArray[np.int64]
    ) -> tuple[BatchMarginals, npt.NDArray[np.int64]]:
        rows, targets = [], []
        for slot, root in zip(slots.tolist(), context_lens.tolist(), strict=True):
            sequence, marginals, (trace, origin) = self._requests[self._slots[slot]]
            m = marginals.get(root)
            if m is None:
                raise ConfigError(
                    f"{origin}: no drafter marginals at position {root}; this trace can replay "
                    f"only policies whose steps start where the recorded run's did (recorded "
                    f"policy: {trace.metadata.get('policy', 'unknown')})"
                )
            rows.append(m)
            targets.append(sequence[root + 1 :])
        batch = BatchMarginals.from_rows(rows)
        width = batch.probs.shape[1] + 1
        target = np.full((len(rows), width), -1, np.int64)
        for j, t in enumerate(targets):
            target[j, : min(width, t.shape[0])] = t[:width]
        return batch, target


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


@public
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


@public
def trace_source(path: Path) -> TraceSource:
    """A source replaying every trace under ``path`` (a file or a directory)."""
    return TraceSource(load_traces(path))
