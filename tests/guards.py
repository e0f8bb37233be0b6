"""A hang guard for tests that feed hostile input: a call that runs too long fails the test."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

HANG_GUARD_S = 60  # generous for a loaded CI machine: a refusal takes well under a second


@contextlib.contextmanager
def hang_guard(seconds: int = HANG_GUARD_S, what: str = "a bad input") -> Iterator[None]:
    """Raise TimeoutError in the body if it runs for more than ``seconds`` (SIGALRM)."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} ran for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
