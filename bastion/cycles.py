"""The learning controller's cycle table: measured/predicted cycle ratios on a token lattice.

The controller of :mod:`bastion.controller` prices a tree size by the prior's cycle (the
calibrated roofline) times the ratio measured at that size's lattice cell. :func:`token_lattice`
is the lattice (1 … 8, every 8 tokens up to 256, then coarser: dense where GEMM tile choices
change most); :class:`CycleTable` holds, per cycle kind (a tree, the chain, a target-only AR
step), batch-size bucket (:func:`batch_bucket`) and cell, the median of the last observations.

What this module does not do: time anything, or know the prior (:mod:`bastion.learned`).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from bastion.errors import BudgetError
from bastion.guard import integer, public

try:  # the optional compiled kernel: the cells' medians in one call
    from bastion import _bestfirst as _compiled  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the extension is optional
    _compiled = None
_medians_kernel = getattr(_compiled, "medians", None)
_fill_row = getattr(_compiled, "fill_row", None)
_finite_median = getattr(_compiled, "finite_median", None)

__all__ = [
    "LATTICE",
    "REFRESH_SHIFT",
    "CycleKind",
    "CycleTable",
    "batch_bucket",
    "lattice_index",
    "token_lattice",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
CycleKind = Literal["tree", "chain", "ar"]
_KINDS: tuple[CycleKind, ...] = ("tree", "chain", "ar")

# (up to, step): every 8 tokens up to 256, every 16 up to 512, … — dense where GEMM tile
# choices change most (multiples of 8/16/64/128 tokens), coarse where a step is a small share
_SPACING = ((8, 1), (256, 8), (512, 16), (1024, 32), (2048, 64), (4096, 128), (8192, 256))
_TOP = 1 << 20  # the largest total the lattice covers (MAX_TREE_SIZE)
# derived estimates (filled ratios, curves built on them) are refreshed once per this many
# observations: the medians move slowly, and the controller's per-step time is what it costs
REFRESH_SHIFT = 4  # every 16
_REFRESH_MASK = (1 << REFRESH_SHIFT) - 1


@public(error=BudgetError, hi=integer(1, _TOP))
def token_lattice(hi: int = _TOP) -> IntArray:
    """The candidate token counts up to ``hi``: 1 … 8, then every 8 up to 256, 16 up to 512,
    32 up to 1024, 64 up to 2048, 128 up to 4096, 256 up to 8192, then doubling steps."""
    points: list[int] = []
    lo = 0
    for top, step in _SPACING:
        points.extend(range(lo + step, min(top, hi) + 1, step))
        lo = top
        if top >= hi:
            break
    step = 512
    while lo < hi:
        points.extend(range(lo + step, min(2 * lo, hi) + 1, step))
        lo, step = 2 * lo, 2 * step
    if not points or points[-1] != hi:
        points.append(hi)
    return np.asarray(sorted(set(points)), dtype=np.int64)


LATTICE = token_lattice()
LATTICE.flags.writeable = False
_LATTICE_POINTS = tuple(LATTICE.tolist())  # for bisect: one cell lookup per observation
# the bucket of every batch size below this (batch_bucket's fast path)
_BUCKETS_UP_TO = 4097
_BUCKETS = (0, *(min(10, round(math.log2(b))) for b in range(1, _BUCKETS_UP_TO)))
_CELLS = LATTICE.shape[0]  # a tree row's cells
_ONE = np.ones(1)  # the typical tree ratio where no tree cell is measured (read-only)
_ONE.flags.writeable = False
# per batch bucket, every bucket nearest first (ties: the smaller)
_NEAREST = tuple(tuple(sorted(range(11), key=lambda x: (abs(x - b), x))) for b in range(11))


def lattice_index(tokens: npt.ArrayLike) -> IntArray:
    """Index in :data:`LATTICE` of the smallest lattice point ≥ each token count."""
    try:  # guarded in the body, not by @public: it runs several times per decode step
        return np.asarray(np.searchsorted(LATTICE, np.asarray(tokens, dtype=np.int64)), np.int64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BudgetError(f"tokens must be token counts (integers); got {tokens!r:.80}") from exc


def batch_bucket(batch_size: int) -> int:
    """The batch-size bucket of a step: the power of two nearest to B in log scale (≤ 1024)."""
    # guarded in the body, not by @public: it runs a dozen times per decode step
    if type(batch_size) is int and 0 < batch_size < _BUCKETS_UP_TO:
        return _BUCKETS[batch_size]  # the common case, one lookup
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise BudgetError(f"batch_size must be an integer ≥ 1; got {batch_size!r:.80}")
    if batch_size < 1:
        raise BudgetError(f"batch_size must be ≥ 1; got {batch_size}")
    return min(10, round(math.log2(batch_size)))


def small_median(values: list[float]) -> float:
    """The median of a few floats (a ring of ratios; a hot path, so no numpy)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else 0.5 * (ordered[half - 1] + ordered[half])


def sorted_median(values: FloatArray) -> float:
    """np.median of a non-empty 1-D float array without NaN, from one sort (np.median's
    value: the middle one, or the middle two's mean; several × faster on small arrays)."""
    ordered = np.sort(values)
    half = ordered.shape[0] // 2
    if ordered.shape[0] % 2:
        return float(ordered[half])
    return 0.5 * (float(ordered[half - 1]) + float(ordered[half]))


@public(error=BudgetError, window=integer(1, 1000))
class CycleTable:
    """Measured/predicted cycle ratios per (kind, batch bucket, lattice cell), robust to noise.

    Each cell keeps its last ``window`` ratios in a ring and reads as their median. ``version``
    counts updates (a caller caches derived curves per version).
    """

    def __init__(self, window: int = 9) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise BudgetError(f"window must be an integer ≥ 1; got {window!r}")
        self.window = window
        n = LATTICE.shape[0]
        # per kind: [bucket, cell, slot] ring buffers, counts and medians (NaN: never measured)
        self._ring = {k: np.full((11, n if k == "tree" else 1, window), np.nan) for k in _KINDS}
        self._count = {k: np.zeros((11, n if k == "tree" else 1), np.int64) for k in _KINDS}
        self._median = {k: np.full((11, n if k == "tree" else 1), np.nan) for k in _KINDS}
        self._flat = _flat_views(self._ring, self._count)  # (see observe)
        # per kind, the flat [bucket, cell] indices observed since their medians were last
        # taken (see _medians): a cell's median is read at a refresh, not after every observation
        self._stale: dict[CycleKind, set[int]] = {k: set() for k in _KINDS}
        self._filled: dict[tuple[str, int], tuple[tuple[int, int], FloatArray]] = {}
        self._first: set[tuple[str, int]] = set()  # (kind, bucket) measured at least once
        self._noise: dict[tuple[str, int], tuple[int, float]] = {}
        # the tree cells' typical ratio of a bucket (see _fill), per tree observation count
        self._typical: tuple[tuple[int, int], FloatArray] | None = None
        self._kind_version = dict.fromkeys(_KINDS, 0)  # updates per kind
        self.version = 0
        # moves whenever ratios() of any kind, in any bucket, may read differently (whenever
        # a kind's refresh comes or a bucket is first measured): a cache key, one int to compare
        self.ratio_epoch = 0

    def observe(self, kind: CycleKind, batch_size: int, tokens: int, ratio: float) -> None:
        """One measured/predicted ratio of a ``kind`` cycle of ``tokens`` total tree tokens."""
        if not (math.isfinite(ratio) and ratio > 0):
            return  # a failed or degenerate measurement teaches nothing
        if type(batch_size) is int and 0 < batch_size < _BUCKETS_UP_TO:
            b = _BUCKETS[batch_size]  # (batch_bucket's fast path, without its call)
        else:
            b = batch_bucket(batch_size)
        cell = bisect_left(_LATTICE_POINTS, tokens) if kind == "tree" else 0
        if cell >= _CELLS:
            raise IndexError(f"tokens beyond the lattice: {tokens!r:.80}")
        # one slot and one count per step, through flat views of the arrays: a memoryview's
        # item costs a fraction of a numpy scalar index
        rings, counts = self._flat[kind]
        at = b * (_CELLS if kind == "tree" else 1) + cell
        seen = counts[at]
        window = self.window
        rings[at * window + seen % window] = ratio
        counts[at] = seen + 1
        self._stale[kind].add(at)
        version = self._kind_version[kind] = self._kind_version[kind] + 1
        if not version & _REFRESH_MASK:  # its ratios refresh (see _stamp)
            self.ratio_epoch += 1
        self.version += 1
        if (kind, b) not in self._first:  # a bucket's first measurement is seen at once
            self._first.add((kind, b))
            self._filled.clear()
            self.ratio_epoch += 1

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)  # (a copy: the views are of this table's arrays)
        del state["_flat"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._flat = _flat_views(self._ring, self._count)

    def _medians(self, kind: CycleKind) -> FloatArray:
        """[bucket, cell] the median of each cell's ring of ``kind`` (NaN: never measured),
        the cells of ``kind`` observed since the last read taken now (another kind's wait for
        its own read: a median is its ring's as of the read either way)."""
        cells = self._stale[kind]
        if cells:
            if _medians_kernel is not None:  # all of them in one compiled call
                _medians_kernel(
                    self._ring[kind],
                    self._count[kind],
                    self.window,
                    array("q", cells),  # (int64 for the kernel, cheaper than np.array)
                    self._median[kind],
                )
            else:
                width = self._count[kind].shape[1]
                for at in cells:
                    b, cell = divmod(at, width)
                    seen = min(int(self._count[kind][b, cell]), self.window)
                    ring = self._ring[kind][b, cell, :seen].tolist()
                    self._median[kind][b, cell] = small_median(ring)
            cells.clear()
        return self._median[kind]

    def noise(self, kind: CycleKind, batch_size: int) -> float:
        """The relative spread of one observation in the bucket: 1.4826 × the median absolute
        deviation of every stored ratio from its cell's median, relative to that median (0
        with fewer than two observations in any cell)."""
        b = batch_bucket(batch_size)
        epoch = self.version >> 6  # re-estimated every 64 observations: it moves slowly
        hit = self._noise.get((kind, b))
        if hit is not None and hit[0] == epoch:
            return hit[1]
        ring = self._ring[kind][b]
        med = self._medians(kind)[b]
        many = self._count[kind][b] >= 2
        value = 0.0
        if many.any():
            dev = np.abs(ring[many] / med[many, None] - 1.0)
            dev = dev[~np.isnan(dev)]  # the rings' empty slots (np.nanmedian, several × faster)
            value = 1.4826 * sorted_median(dev) if dev.size else 0.0
        self._noise[(kind, b)] = (epoch, value)
        return value

    def stamp(self, kind: CycleKind) -> tuple[int, int, int]:
        """Changes whenever :meth:`ratios` or :meth:`noise` of ``kind`` may read differently
        (a cache of curves derived from them is valid while it stays the same; the counts of
        :meth:`count` move every observation and are read as of the stamp's change)."""
        return (self._kind_version[kind] >> REFRESH_SHIFT, len(self._first), self.version >> 6)

    def _stamp(self, kind: CycleKind) -> tuple[int, int]:
        # an AR or chain row reads the tree cells only while no bucket of its kind is measured
        versions = self._kind_version
        reads_tree = kind != "tree" and versions[kind] == 0
        return (
            versions[kind] >> REFRESH_SHIFT,
            versions["tree"] >> REFRESH_SHIFT if reads_tree else 0,
        )

    def count(self, kind: CycleKind, batch_size: int) -> IntArray:
        """Observations per cell of ``kind`` in the bucket of ``batch_size`` (read-only)."""
        return np.asarray(self._count[kind][batch_bucket(batch_size)], dtype=np.int64)

    def ratios(self, kind: CycleKind, batch_size: int) -> FloatArray:
        """The ratio of every cell of the bucket (read-only): measured medians, gaps filled by
        interpolation between measured cells of the bucket, else from the nearest measured
        bucket, else from the tree cells of the bucket, else 1 (the prior as it is)."""
        b = batch_bucket(batch_size)
        key = (kind, b)
        # what the fill reads: every bucket of this kind (nearest-bucket fallback), and the
        # tree cells for an AR or chain cell never measured
        stamp = self._stamp(kind)
        hit = self._filled.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        out = self._fill(kind, b)
        out.flags.writeable = False
        self._filled[key] = (stamp, out)
        return out

    def _fill(self, kind: CycleKind, b: int) -> FloatArray:
        order = _NEAREST[b]  # this bucket, then the nearest
        first = self._first
        if kind != "tree" and not self._kind_version[kind]:  # no bucket of the kind measured:
            return self._typical_tree(b, order, first)  # (the loop below would find none)
        med = self._medians(kind)
        # a bucket never measured holds NaN only: skipped without looking (the lookup is what
        # a refresh mostly did, several buckets in a row)
        for bb in order:
            if (kind, bb) not in first:
                continue
            row = med[bb]
            if _fill_row is not None:  # the same values, compiled (tests/test_cycle_fill.py)
                filled = _fill_row(row)
                if filled is not None:
                    return np.frombuffer(filled, np.float64)
                continue
            ok = np.isfinite(row)
            if ok.any():
                if ok.all():
                    return np.array(row, dtype=np.float64)
                x = np.flatnonzero(ok)
                return np.asarray(np.interp(np.arange(row.shape[0]), x, row[x]), np.float64)
        if kind != "tree":  # no AR or chain cycle measured yet: the tree cells' typical ratio
            return self._typical_tree(b, order, first)
        return np.ones(med.shape[1])

    def _typical_tree(
        self, b: int, order: tuple[int, ...], first: set[tuple[str, int]]
    ) -> FloatArray:
        """[1] the median ratio of the measured tree cells of bucket ``b`` or the nearest
        measured bucket (1 if none): what an AR or chain row reads before its kind is measured.
        It reads the tree rings alone, which only a tree observation changes, so it is kept per
        (bucket, tree observations): the AR and the chain row of a refresh share one (read-only)
        array instead of taking the same median twice."""
        key = (b, self._kind_version["tree"])
        hit = self._typical
        if hit is not None and hit[0] == key:
            return hit[1]
        out = _ONE  # (none measured: read-only, shared)
        tree = self._medians("tree")
        for bb in order:
            if ("tree", bb) not in first:
                continue
            row = tree[bb]
            if _finite_median is not None:  # small_median's value, compiled (test_cycle_fill)
                typical = _finite_median(row)
                if typical is not None:
                    out = np.array([typical])
                    break
                continue
            vals = row[np.isfinite(row)]
            if vals.size:  # np.median's value: the middle one, or the middle two's mean
                out = np.array([small_median(vals.tolist())])
                break
        out.flags.writeable = False
        self._typical = (key, out)
        return out


def _flat_views(
    rings: dict[CycleKind, FloatArray], counts: dict[CycleKind, IntArray]
) -> dict[CycleKind, tuple[Any, Any]]:
    """Per kind, 1-D views (memoryviews) of its [bucket, cell, slot] rings and [bucket, cell]
    counts."""
    out: dict[CycleKind, tuple[Any, Any]] = {}
    for k in _KINDS:
        ring: Any = rings[k].data
        count: Any = counts[k].data
        out[k] = (
            ring.cast("B").cast(rings[k].dtype.char),
            count.cast("B").cast(counts[k].dtype.char),
        )
    return out
