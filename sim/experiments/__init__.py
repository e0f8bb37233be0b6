"""Experiments: a grid of simulations from a TOML config, run by any executor, resumable.

``bastion experiment --config FILE.toml`` (or ``bastion experiment NAME`` for a shipped config)
expands the config's grid — models, GPUs, workloads, truths, policies (plug-ins included),
concurrency or arrival rates, requests, output length, seeds, cost models — into independent
*runs* (each a :class:`bastion.sim.simulate.SimSpec`), executes them with a pluggable executor —
``process`` (a local process pool, the default), ``serial``, or ``ray`` (a local Ray instance,
or a cluster with ``--address``) — and writes ``OUT/NAME/results.csv`` and ``results.json``
(one record per run and policy), ``requests.csv`` (one row per run, policy and request),
``summary.md`` and, for the paper's analyses, their plots. The config format is documented in
``docs/experiments-config.md``.

The package, one concern per module:

- :mod:`.config` — reading and validating a config (:func:`load_config`), finding shipped ones;
- :mod:`.runs` — what a run is and its key (:func:`run_key`: a hash of the spec and of the
  contents of everything it reads), by which the run store files finished runs, so an
  interrupted experiment resumes where it stopped and a changed input is never served stale;
- :mod:`.worker` — executing one run (:func:`execute`), picklable for pools and Ray;
- :mod:`.executors` — computing the missing runs serially, in a process pool, or on Ray
  (:mod:`.ray_executor`), rows assembled in run order so every executor gives identical results;
- :mod:`.reports` — one module per report, chosen by the config's ``report`` name
  (:data:`REPORTS`);
- :mod:`.runner` — running an experiment end to end (:func:`run_experiment`).

What this package does not do: simulate (sim.simulate) or define workloads (sim.workloads).
"""

from __future__ import annotations

from .config import (
    EXPERIMENT_DIR_ENV,
    GRID_KEYS,
    ExperimentConfig,
    experiment_dirs,
    known_experiments,
    load_config,
    resolve_config,
)
from .executors import EXECUTORS, run_all
from .reports import REPORTS
from .runner import Plan, plan, run_experiment
from .runs import fingerprint, make_run, run_key
from .worker import execute, records_of

__all__ = [
    "EXECUTORS",
    "EXPERIMENT_DIR_ENV",
    "GRID_KEYS",
    "REPORTS",
    "ExperimentConfig",
    "Plan",
    "execute",
    "experiment_dirs",
    "fingerprint",
    "known_experiments",
    "load_config",
    "make_run",
    "plan",
    "records_of",
    "resolve_config",
    "run_all",
    "run_experiment",
    "run_key",
]
