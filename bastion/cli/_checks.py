"""Range checks of command-line numbers, run before any work (one-line errors, exit status 2).

argparse converts the types; these say which values are accepted, so a negative seed, a zero
worker count, an infinite temperature or a size that would allocate terabytes is refused with a
:class:`BudgetError` naming the flag, before anything is loaded or allocated.
"""

from __future__ import annotations

import math

from bastion.errors import BudgetError

#: Largest seed accepted (numpy's generators take any integer ≥ 0; this keeps seeds portable).
MAX_SEED = 2**63 - 1


def int_in(flag: str, value: int | None, least: int, most: int | None = None) -> None:
    """Refuse ``value`` outside [least, most] (``None`` is left alone: an unset option)."""
    if value is None:
        return
    if value < least or (most is not None and value > most):
        accepted = f"≥ {least}" + (f" and ≤ {most}" if most is not None else "")
        raise BudgetError(f"{flag} must be {accepted}; got {value}")


def seed(value: int | None, flag: str = "--seed") -> None:
    int_in(flag, value, 0, MAX_SEED)


def float_in(
    flag: str,
    value: float | None,
    least: float,
    most: float = math.inf,
    *,
    open_low: bool = False,
) -> None:
    """Refuse a NaN, an infinity or ``value`` outside [least, most] ((least, most] when
    ``open_low``)."""
    if value is None:
        return
    low_ok = value > least if open_low else value >= least
    if not (math.isfinite(value) and low_ok and value <= most):
        if open_low:
            accepted = f"in ({least:g}, {most:g}]" if math.isfinite(most) else f"> {least:g}"
        else:
            accepted = f"≥ {least:g}" + (f" and ≤ {most:g}" if math.isfinite(most) else "")
        raise BudgetError(f"{flag} must be {accepted} (a finite number); got {value}")
