"""The simulated GPU's MoE routing: independent routing draws and the distinct experts they touch.

A pass of T tokens from R requests reads, in every MoE layer, the experts its tokens route to. The
truth's routing model (:class:`~bastion.sim.ground_truth.GroundTruth`'s ``routing_skew`` and
``routing_correlation``) is its own, not the cost model's: each request's first token routes
afresh and each further token repeats its request's routing with probability
``routing_correlation`` (:func:`routing_draws`); expert popularity is Zipf with exponent
``routing_skew`` (:meth:`~bastion.sim.ground_truth.GroundTruth.expert_popularity`), and
:func:`expected_experts` gives the expected distinct experts per layer over those draws.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from bastion.guard import array, integer, number, public
from bastion.sim.ground_truth import GroundTruth

__all__ = ["expected_experts", "routing_draws"]

Array = npt.NDArray[np.float64]


@public(
    tokens=array(lo=0),
    requests=array(lo=0),
    correlation=number(0.0, 1.0),
    broadcast=("tokens", "requests"),
)
def routing_draws(tokens: npt.ArrayLike, requests: npt.ArrayLike, correlation: float) -> Array:
    """Independent routing draws of a pass: each request's first token routes afresh, each
    further token repeats its request's routing with probability ``correlation``:
    requests + (tokens − requests)·(1 − correlation)."""
    t = np.asarray(tokens, dtype=np.float64)
    r = np.asarray(requests, dtype=np.float64)
    return np.asarray(r + (t - r) * (1.0 - correlation), dtype=np.float64)


@public(
    draws=array(lo=0),
    experts=integer(1, 1 << 20),
    per_token=integer(1, 1 << 20),
    popularity=array(1, lo=0.0, hi=1.0),
)
def expected_experts(
    draws: npt.ArrayLike, experts: int, per_token: int, popularity: npt.ArrayLike | None = None
) -> Array:
    """Expected distinct experts a layer reads for ``draws`` independent top-K routings.

    Expert e is among a token's K with probability π_e = min(1, K·p_e) (p_e its popularity);
    over x draws it is touched with probability 1 − (1 − π_e)^x, so E[U] = Σ_e 1 − (1 − π_e)^x.
    Uniform routing (p_e = 1/E) gives E·(1 − (1 − K/E)^x).
    """
    x = np.asarray(draws, dtype=np.float64)
    if popularity is None:
        return np.asarray(experts * (1.0 - (1.0 - per_token / experts) ** x), dtype=np.float64)
    pi = np.minimum(1.0, per_token * np.asarray(popularity, dtype=np.float64))
    miss = np.log1p(-np.minimum(pi, 1.0 - 1e-12))  # log(1 − π_e)
    return np.asarray(experts - np.exp(np.multiply.outer(x, miss)).sum(axis=-1), dtype=np.float64)


def routing_draws_one(tokens: float, requests: float, truth: GroundTruth) -> float:
    """:func:`routing_draws` for scalars (the per-step path)."""
    return requests + (tokens - requests) * (1.0 - truth.routing_correlation)
