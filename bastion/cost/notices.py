"""What a calibration record tells the user on stderr: that a cached record stands in for a
measurement, and that a record fits its own timings too poorly to be trusted."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from bastion.errors import ArgumentError

POOR_FIT = 0.25  # a record whose held-out error (cv_mape) exceeds this is flagged as suspect

# records this process measured and wrote: reading one back later in the same run is not a
# reuse of an old measurement, so it is not announced as one
_MEASURED_HERE: set[Path] = set()


def warn_if_poor(record: Any, path: Path) -> bool:
    """One stderr line when ``record`` (a ``CalibrationRecord``: its ``cv_mape`` and
    ``cv_max_error``) fits its own sweep poorly (held-out mean error above
    :data:`POOR_FIT`): on a CPU that is almost always a sweep timed while other work ran, and
    the cost model would price every decision from it. Whether it warned."""
    error = getattr(record, "cv_mape", None)
    if not isinstance(error, float) or not isinstance(path, Path):
        raise ArgumentError("warn_if_poor needs a CalibrationRecord and a Path")
    if not np.isfinite(error) or error <= POOR_FIT:
        return False
    print(
        f"bastion: the calibration record {path} fits its own timings poorly (held-out error "
        f"{error:.0%}, worst {record.cv_max_error:.0%}): the machine was probably busy while it "
        "was timed; --refit on a quiet machine",
        file=sys.stderr,
    )
    return True


def measured_here(path: Path) -> None:
    """Note that this process measured and wrote the record at ``path``."""
    _MEASURED_HERE.add(Path(path).resolve())


def announce_reuse(path: Path) -> None:
    """One stderr line whenever a cached record stands in for a measurement: one written
    before this process started (or by another), not one this process measured
    (:func:`measured_here`)."""
    if Path(path).resolve() in _MEASURED_HERE:
        return
    print(
        f"bastion: reusing the calibration record {path} (--refit to measure again)",
        file=sys.stderr,
    )
