"""Shared pytest setup: Hypothesis profiles, slow tests, one thread per test process.

``ci`` (chosen when the environment variable CI is set, as on the CI runner) runs at least 200
examples per property; ``dev`` runs 50 for a quick local loop. ``HYPOTHESIS_PROFILE`` overrides.
Tests marked ``slow`` run when CI is set or when ``-m`` selects them (``pytest -m slow``); a
local run without either skips them, saying so.

The run is spread over worker processes (pytest-xdist, ``addopts`` in pyproject.toml; ``-n 0``
for one process). Each runs torch on one thread (``OMP_NUM_THREADS``, unless set already): the
tests' models are tiny, and threads that spin-wait for a busy core made a loaded machine's run
several times slower.
"""

import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any test module imports torch

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("CI") or config.getoption("markexpr"):
        return
    skip = pytest.mark.skip(reason="slow: runs under CI=true or with pytest -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _no_user_calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Module- and session-scoped fixtures are built before a test's own fixtures: this one
    keeps them out of the user's calibration records (~/.cache/bastion) too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BASTION_CALIBRATION_DIR", str(tmp_path_factory.mktemp("calibration-shared")))
        yield


@pytest.fixture(autouse=True)
def _private_calibration_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Tests never read or write the user's calibration records (~/.cache/bastion)."""
    path = tmp_path_factory.mktemp("calibration")
    monkeypatch.setenv("BASTION_CALIBRATION_DIR", str(path))
    yield path


@pytest.fixture
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One local Ray instance at a time across the run's worker processes: ``ray.init()``
    without an address joins a local instance that is already running (another worker's)
    instead of starting its own."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock (and no parallel Ray tests there)
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "bastion-local-ray.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield
