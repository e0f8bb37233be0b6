"""Shared pytest setup: Hypothesis profiles.

``ci`` (chosen when the environment variable CI is set, as on the CI runner) runs at least 200
examples per property; ``dev`` runs 50 for a quick local loop. ``HYPOTHESIS_PROFILE`` overrides.
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


@pytest.fixture(autouse=True)
def _private_calibration_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Tests never read or write the user's calibration records (~/.cache/bastion)."""
    path = tmp_path_factory.mktemp("calibration")
    monkeypatch.setenv("BASTION_CALIBRATION_DIR", str(path))
    yield path
