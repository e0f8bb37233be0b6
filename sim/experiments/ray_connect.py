"""Connecting to a Ray cluster, bounded by ``--connect-timeout`` in every failure mode.

``ray.init(address=…)`` has no deadline of its own: pointed at a port where something that is
not Ray's GCS listens (a web server, a silent socket, another service) it waits forever, and a
cluster of another Ray version fails only after its own retries, with a long traceback. So
before the driver joins, :func:`check_address` tries the address within one deadline of
``timeout`` seconds, in three steps:

1. the host name is resolved (in a thread, so a slow resolver cannot outlast the deadline);
2. a TCP connection is opened (a closed port or an unroutable host fails here);
3. ``ray.init(address)`` is run in a *separate process* that is killed at the deadline — the
   only way to bound a call that cannot be cancelled — and must come back connected (a silent
   or non-Ray listener times out; a version mismatch or any other refusal exits with Ray's
   message, of which the last line is kept).

Any failure is one :class:`bastion.errors.ConfigError` line (``bastion experiment`` exits 2).
The probe costs a second connection (about a second on a reachable cluster; it appears in the
cluster's job list as a short driver). After it succeeds the driver calls ``ray.init`` itself,
whose own failures are turned into the same one-line error.

What this module does not do: run anything on the cluster (:mod:`.ray_executor`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from bastion.errors import ConfigError
from bastion.guard import public

__all__ = ["PROBE", "check_address", "one_line"]

MAX_TIMEOUT_S = 86_400.0  # the longest connection timeout check_address takes (a day)

PROBE = (
    "import sys, ray; "
    "ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR'); "
    "print(ray.__version__); ray.shutdown()"
)
"""What the probe process runs (``python -c PROBE ADDRESS``): join the cluster, then leave."""

HINT = (
    "is the head node up (`ray status` on it), is the port open, and is this the GCS address "
    "`ray start --head` printed (HOST:6379) or a Ray Client address (ray://HOST:10001)?"
)


@public
def one_line(text: str, limit: int = 300) -> str:
    """The last non-empty line of ``text`` (an error's message), at most ``limit`` characters."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "no message"
    return last if len(last) <= limit else last[: limit - 1] + "…"


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"--address {address!r}: expected HOST:PORT (the head node's GCS address that "
            "`ray start --head` prints, port 6379 by default), ray://HOST:PORT (Ray Client, "
            "port 10001 by default) or 'auto'"
        )
    return host.strip("[]"), int(port)


def _resolve(host: str, port: int, seconds: float) -> list[Any]:
    """getaddrinfo within ``seconds`` (it has no timeout of its own)."""
    out: list[Any] = []
    error: list[OSError] = []

    def work() -> None:
        try:
            out.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            error.append(exc)

    thread = threading.Thread(target=work, name="bastion-resolve", daemon=True)
    thread.start()
    thread.join(max(seconds, 0.0))
    if thread.is_alive():
        raise TimeoutError(f"resolving {host!r} took longer")
    if error:
        raise error[0]
    return out


def _connect(host: str, port: int, seconds: float) -> None:
    last: OSError = OSError(f"no address for {host!r}")
    deadline = time.monotonic() + seconds
    for family, kind, proto, _, addr in _resolve(host, port, seconds):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        with socket.socket(family, kind, proto) as s:
            s.settimeout(left)
            try:
                s.connect(addr)
                return
            except OSError as exc:
                last = exc
    raise last


def _probe(address: str, seconds: float) -> None:
    """``ray.init(address)`` in a process of its own, killed (with its children) at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE, address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killed whole at the deadline
    )
    try:
        _, err = proc.communicate(timeout=max(seconds, 0.1))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):  # it may have ended in between
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError from None
    if proc.returncode != 0:
        raise ConnectionError(one_line(err))


@public
def check_address(address: str, timeout: float) -> None:
    """Raise :class:`ConfigError` (one line) unless a Ray cluster accepts a driver at
    ``address`` within ``timeout`` seconds, whatever is (or is not) listening there.
    ``timeout``: a number of seconds > 0, at most a day (a deadline must be a clock time)."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float | np.integer | np.floating)
        or not 0 < float(timeout) <= MAX_TIMEOUT_S
    ):
        raise ConfigError(
            f"check_address: timeout must be a number of seconds > 0 and ≤ {MAX_TIMEOUT_S:g}; "
            f"got {timeout!r:.80}"
        )
    timeout = float(timeout)
    if address == "local":
        return  # ray.init starts a new local instance
    deadline = time.monotonic() + timeout
    if address != "auto":
        host, port = _host_port(address)
        try:
            _connect(host, port, timeout)
        except OSError as exc:  # TimeoutError included
            raise ConfigError(
                f"cannot reach a Ray cluster at {address} within {timeout:g} s "
                f"({one_line(str(exc)) or 'timed out'}); {HINT}"
            ) from None
    try:
        _probe(address, deadline - time.monotonic())
    except TimeoutError:
        raise ConfigError(
            f"no Ray cluster answered at {address} within {timeout:g} s (the port is open, but "
            f"what listens there did not accept a Ray driver); {HINT} A larger "
            "--connect-timeout helps only a slow cluster."
        ) from None
    except ConnectionError as exc:
        raise ConfigError(f"Ray could not connect to {address}: {exc}") from None
