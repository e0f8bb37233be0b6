"""The project's property tests draw from the public strategies in :mod:`bastion.testing`."""

from bastion.testing import batches, convex_costs, cost_curves, marginals, monotone_costs, prob_rows

__all__ = ["batches", "convex_costs", "cost_curves", "marginals", "monotone_costs", "prob_rows"]
