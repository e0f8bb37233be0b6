"""Executors: compute the runs an experiment lacks, serially, in a process pool, or on Ray.

:func:`run_all` skips the runs already in the store (saying so on stderr), computes the others
with the chosen executor — ``serial``, ``process`` (a local process pool, the default) or
``ray`` (:mod:`.ray_executor`) — saves each finished run atomically, and returns every run's rows
in the order of the run list, so every executor gives identical results. Pool workers exit the
moment the process that started them dies (even by SIGKILL).

What this module does not do: simulate (:mod:`.worker` does, one run at a time).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from bastion.errors import ConfigError
from bastion.guard import each, mapping_with, public
from bastion.sim.results import RunStore

from . import worker
from .runs import Row, Run

__all__ = ["EXECUTORS", "run_all"]

log = logging.getLogger(__name__)

EXECUTORS = ("process", "serial", "ray")


def _watch_parent(parent: int) -> None:
    """In a pool worker: exit when the process that started it dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        try:  # the kernel sends SIGKILL the moment the parent dies
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - not glibc
            pass
    if os.getppid() != parent:  # it died before the watch began
        os._exit(1)

    def watch() -> None:  # elsewhere (and as a fallback): poll for re-parenting
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="bastion-parent-watch", daemon=True).start()


@public(runs=each(mapping_with("spec")))
def run_all(
    runs: Sequence[Run],
    store: RunStore,
    executor: str = "process",
    workers: int | None = None,
    address: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    connect_timeout: float = 30.0,
) -> list[Row]:
    """Execute the runs not yet in ``store``; return every run's rows in ``runs`` order."""
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
    todo = [r for r in runs if not store.has(r)]
    stored = len(runs) - len(todo)
    if stored:
        print(
            f"bastion: reusing {stored} stored run(s) of {len(runs)} from {store.directory} "
            "(keyed by spec, input contents and bastion version)",
            file=sys.stderr,
        )
    total, done = len(todo), 0
    if todo:
        log.info("%d of %d runs to compute", total, len(runs))

    def finished(run: Run, out: tuple[list[Row], list[Row]]) -> None:
        nonlocal done
        store.save(run, *out)
        done += 1
        if progress is not None:
            progress(done, total)

    if executor == "serial" or (executor == "process" and len(todo) <= 1):
        for run in todo:
            finished(run, worker.execute(run))
    elif executor == "process":
        with ProcessPoolExecutor(
            max_workers=workers or os.cpu_count() or 1,
            initializer=_watch_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = {pool.submit(worker.execute, run): run for run in todo}
            try:
                for fut in as_completed(futures):
                    finished(futures[fut], fut.result())
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    else:
        from .ray_executor import run_ray

        run_ray(todo, finished, address, workers, connect_timeout)
    return [row for run in runs for row in store.load(run)]
