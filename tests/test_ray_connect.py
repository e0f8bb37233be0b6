"""check_address refuses a timeout it cannot turn into a deadline with the project's error."""

from __future__ import annotations

import numpy as np
import pytest

from bastion.errors import BastionError, ConfigError
from bastion.sim.experiments.ray_connect import MAX_TIMEOUT_S, check_address


@pytest.mark.parametrize("timeout", [1e300, -1, 0, MAX_TIMEOUT_S * 2, float("nan"), "5"])
def test_a_bad_timeout_is_a_project_error(timeout: object) -> None:
    with pytest.raises(BastionError, match="timeout"):
        check_address("127.0.0.1:1", timeout)  # type: ignore[arg-type]


def test_a_numpy_timeout_is_accepted() -> None:
    """A numpy float32 (what the fuzz test drew) is a number of seconds like any other: here
    nothing listens on port 1, so the refusal is about the address, not the type."""
    with pytest.raises(ConfigError, match="cannot reach a Ray cluster"):
        check_address("127.0.0.1:1", np.float32(0.5))  # type: ignore[arg-type]
