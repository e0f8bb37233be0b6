"""The one exception family of Bastion.

Every error the library raises on bad input is a :class:`BastionError` subclass whose message
says what was wrong and what is accepted. The subclasses also derive from the matching builtin
(``ValueError``, ``KeyError``…) so callers that catch those keep working.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "BackendError",
    "BastionError",
    "BudgetError",
    "CheckpointError",
    "ConfigError",
    "CostModelError",
    "MarginalsError",
    "MemoryLimitError",
    "PolicyError",
    "UnknownNameError",
]


class BastionError(Exception):
    """Base class of every error Bastion raises on purpose."""


class MarginalsError(BastionError, ValueError):
    """Drafter marginals that are empty, mis-shaped, not probabilities, or not sorted."""


class BudgetError(BastionError, ValueError):
    """A tree budget or policy parameter outside its accepted range."""


class CostModelError(BastionError, ValueError):
    """A cost model that returned a non-positive, non-finite or mis-shaped cost."""


class ConfigError(BastionError, ValueError):
    """A configuration file or record that is missing fields or holds invalid values."""


class MemoryLimitError(ConfigError):
    """A simulated serving setup that does not fit its GPU's memory: a model whose weights and
    activations leave no KV-cache block, or a request longer than the whole KV cache holds; the
    message names the memory needed and what there is."""


class UnknownNameError(BastionError, KeyError):
    """An unknown name (device, model, policy, workload…); the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would repr() the message; show it as written
        return str(self.args[0]) if self.args else ""


class PolicyError(BastionError, TypeError):
    """A tree policy that answered with the wrong type (``choose`` returning no ``TreeChoice``,
    ``choose_batch`` no ``BatchChoice``); the message names the policy."""


class CheckpointError(BastionError, ValueError):
    """A model checkpoint directory with missing, corrupt or mis-named files."""


class BackendError(BastionError, RuntimeError):
    """A model backend that cannot do what was asked (absent device, uncroppable KV cache…)."""


class ArgumentError(BastionError, TypeError, ValueError):
    """A public function's argument of the wrong type, shape or range (the message names it).

    Derives from both ``TypeError`` and ``ValueError``: a caller catching either keeps working."""
