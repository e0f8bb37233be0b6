"""Bastion: budget-aware, tree-structured speculative decoding.

The core (this package minus ``bastion.backends.torch``) needs numpy, scipy, simpy and networkx
only; importing it never imports torch and has no side effects.
"""

from bastion.errors import BastionError
from bastion.tree import DraftMarginals, DraftTree, best_first_tree

__all__ = ["BastionError", "DraftMarginals", "DraftTree", "best_first_tree"]
__version__ = "0.1.0"
