"""A cost-curve cache entry: one situation priced once, corrected and checked once per correction.

Also :class:`Memo`, the store a cost model keeps for prices derived from it alone.

:meth:`bastion.cost.costmodel.RooflineCostModel.cost_curve` keeps one :class:`PricedCurve` per
situation (context bucket, co-batched load); the entry holds the uncorrected prices, applies the
model's current correction to them (:meth:`PricedCurve.correct`) and hands out the read-only
``CostCurve`` of each asked length (:meth:`PricedCurve.curve`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from bastion.errors import CostModelError
from bastion.interfaces import CostCurve

Array = npt.NDArray[np.float64]
Correct = Callable[[Array, Array], Array]  # (bare, calibrated-or-bare) → corrected seconds
Key = TypeVar("Key", bound=Hashable)


def check_seconds(values: Array, what: str) -> Array:
    """``values`` as they are, or a :class:`CostModelError` unless each is finite and > 0."""
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise CostModelError(
            f"{what}: predicted times must be positive and finite; check the calibration"
        )
    return values


class PricedCurve:
    """``cost_curve``'s cache entry for one situation: priced for N = 1 … ``length``.

    Each N is priced elementwise (its price does not depend on which other sizes are priced in
    the same call), so the curve for N ≤ n is the first n entries of a longer one: the roofline
    runs once per situation at a power-of-two length, grown by doubling. The corrected curve,
    how many of its leading entries pass the check, and the ``CostCurve`` of each asked length
    are kept until the correction changes (``stamp``: mode, γ, T_aux).
    """

    __slots__ = ("ar", "ar_base", "base", "curves", "draft_s", "length", "stamp", "valid", "verify")

    def __init__(
        self, length: int, base: tuple[Array, Array], ar_base: tuple[Array, Array], draft_s: float
    ) -> None:
        self.length = length
        self.base = base  # bare, calibrated-or-bare verification seconds, [length]
        self.ar_base = ar_base  # the same for L_AR, [1]
        self.draft_s = draft_s
        self.stamp: tuple[object, ...] | None = None
        self.verify: Array = base[0]  # corrected, read-only
        self.valid = 0  # leading entries of ``verify`` that are finite and > 0
        self.ar: float | None = None  # corrected L_AR, None when it fails the check
        self.curves: dict[int, CostCurve] = {}

    def correct(self, stamp: tuple[object, ...], correct: Correct) -> None:
        """Apply the current correction to this entry and check it once."""
        verify = correct(*self.base)  # bare / static modes: the base array itself
        verify.flags.writeable = False
        ok = np.isfinite(verify) & (verify > 0)
        ar = correct(*self.ar_base)
        self.verify = verify
        self.valid = int(np.argmin(ok)) if not ok.all() else verify.size
        self.ar = float(ar[0]) if bool(np.isfinite(ar[0]) and ar[0] > 0) else None
        self.curves = {}
        self.stamp = stamp

    def curve(self, max_tree_size: int, prep_s: float, correct: Correct) -> CostCurve:
        """The corrected ``CostCurve`` for N = 1 … ``max_tree_size`` (≤ ``length``), made once
        per correction; a :class:`CostModelError` when an entry of it (or L_AR) fails the check."""
        curve = self.curves.get(max_tree_size)
        if curve is None:
            if max_tree_size > self.valid:
                check_seconds(self.verify[:max_tree_size], "verify")  # raises
            if self.ar is None:
                check_seconds(correct(*self.ar_base), "L_AR")  # raises
                raise AssertionError("unreachable")  # pragma: no cover
            curve = CostCurve(
                draft_s=self.draft_s,
                prep_s=prep_s,
                verify_s=self.verify[:max_tree_size],
                ar_step_s=self.ar,
            )
            if len(self.curves) >= 64:
                self.curves.clear()
            self.curves[max_tree_size] = curve
        return curve


def cached_entry(
    cache: OrderedDict[Key, PricedCurve],
    key: Key,
    length: int,
    size: int,
    price: Callable[[], PricedCurve],
) -> PricedCurve:
    """The entry of ``key`` that covers N = 1 … ``length``: the cached one (now the most
    recently used), else a new one from ``price``, the least recently used dropped beyond
    ``size`` entries."""
    entry = cache.get(key)
    if entry is None or entry.length < length:
        entry = price()
        cache[key] = entry
        if len(cache) > size:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return entry


class Memo:
    """Read-only arrays under hashable keys, kept on a cost model (:func:`memo_of`) for prices
    derived from that model alone: the learning controller's prior at its context anchors
    (:class:`bastion.learned_prior.PricedPrior`), keyed with the model's correction stamp, so
    the runs that wrap one model price each anchor once. Emptied beyond ``limit`` bytes."""

    def __init__(self, limit: int = 64 << 20) -> None:
        self.limit = limit
        self._store: dict[Hashable, Array] = {}
        self._bytes = 0

    def get(self, key: Hashable) -> Array | None:
        return self._store.get(key)

    def put(self, key: Hashable, value: Array) -> Array:
        """Keep ``value`` (made read-only) under ``key``; returns it."""
        if self._bytes + value.nbytes > self.limit:
            self._store.clear()
            self._bytes = 0
        value.flags.writeable = False
        self._store[key] = value
        self._bytes += value.nbytes
        return value


def memo_of(model: object) -> Memo:
    """``model``'s :class:`Memo`, made on first use (a model whose inputs other than its
    correction change after use must be a new model, as for ``cost_curve``'s cache)."""
    memo: Memo | None = getattr(model, "_memo", None)
    if memo is None:
        memo = Memo()
        model._memo = memo  # type: ignore[attr-defined]
    return memo
