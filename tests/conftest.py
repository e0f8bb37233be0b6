"""Shared pytest setup: Hypothesis profiles and slow tests.

``ci`` (chosen when the environment variable CI is set, as on the CI runner) runs at least 200
examples per property; ``dev`` runs 50 for a quick local loop. ``HYPOTHESIS_PROFILE`` overrides.
Tests marked ``slow`` run when CI is set or when ``-m`` selects them (``pytest -m slow``); a
local run without either skips them, saying so.
"""

import os
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture(autouse=True)
def _private_calibration_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Tests never read or write the user's calibration records (~/.cache/bastion)."""
    path = tmp_path_factory.mktemp("calibration")
    monkeypatch.setenv("BASTION_CALIBRATION_DIR", str(path))
    yield path
