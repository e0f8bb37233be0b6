"""The device-synchronised wall clock every real-backend timing reads.

``device_clock(device)`` returns a clock that waits for the device's queued work before reading
``time.perf_counter`` (a no-op on CPU), so stage times measure work, not kernel launches.

What this module does not do: time anything itself (the verifier, the decode loop and
:mod:`.timing` do).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from bastion.errors import ArgumentError
from bastion.guard import public

__all__ = ["Clock", "device_clock"]

Clock = Callable[[], float]


@public
def device_clock(device: torch.device | str) -> Clock:
    """A clock in seconds that synchronises ``device`` first (CUDA); plain perf_counter on CPU."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ArgumentError(
            f"device_clock: device must name a torch device; got {device!r}: {exc}"
        ) from None
    if dev.type == "cuda":

        def clock() -> float:
            torch.cuda.synchronize(dev)
            return time.perf_counter()

        return clock
    return time.perf_counter
