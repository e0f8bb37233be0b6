"""A simulated target pass's operator sums in the compiled ``pass_sums`` against numpy's route.

``_price_one`` hands the kernel the pass's per-operator compute and memory seconds (numpy's
product of the features and the operator matrix) and takes back the operators' sum, the
attention operators' sum and the LM head's seconds; every priced pass must be what the numpy
route gives, bit for bit — with and without the kernel-aware step factors, with tensor
parallelism's all-reduces, the host's dispatch and a prefill chunk's separately priced LM head.
Where the kernel's assumptions fail (MoE, measured shape factors, an attention selector that is
not a few ones), the pricer keeps numpy's route."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.sim import pass_pricing
from bastion.sim.ground_truth import GroundTruth
from bastion.sim.pass_pricing import PassPricer

pytestmark = pytest.mark.skipif(
    pass_pricing._pass_sums is None, reason="built without the compiled kernel"
)

_TRUTHS = {
    "plain": GroundTruth(),
    "kernel": replace(GroundTruth(), gemm_shape_model="kernel"),
    "host": replace(GroundTruth(), host_layer_s=2e-5, pass_overhead_s=1e-4, causal_reads_mask=True),
    "host_adds": replace(GroundTruth(), host_layer_s=3e-5, host_adds=True, tile_tokens=0),
}


def _pricers(truth: str, model: str = "qwen3-8b", tp: int = 1) -> tuple[PassPricer, PassPricer]:
    """The same pricer twice: the compiled sums, and numpy's route (the sums switched off)."""
    m = get_model(model)
    args = (get_profile("h100-sxm"), m, DrafterSpec.dflash_for(m), _TRUTHS[truth], tp)
    fast, slow = PassPricer(*args), PassPricer(*args)
    assert fast._sums is not None
    slow._sums = None
    return fast, slow


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(sorted(_TRUTHS)),
    st.sampled_from([("qwen3-8b", 1), ("llama-3.1-8b", 1), ("llama-3.1-70b", 4)]),
    st.integers(1, 64),
    st.integers(1, 40),
    st.integers(1, 40_000),
    st.booleans(),
    st.lists(st.tuples(st.integers(1, 600), st.integers(0, 9_000)), max_size=3),
)
def test_compiled_sums_price_every_pass_as_numpy(
    truth: str,
    model_tp: tuple[str, int],
    requests: int,
    per_request: int,
    context: int,
    tree: bool,
    chunks: list[tuple[int, int]],
) -> None:
    fast, slow = _pricers(truth, *model_tp)
    tokens = float(requests * per_request)
    kv = float(requests * context) + tokens
    pairs = tokens * (context + per_request)
    causal = tokens * context + requests * per_request * (per_request + 1) / 2.0
    one = fast.price_pass(requests, tokens, pairs, kv, tree, causal)
    assert one == slow.price_pass(requests, tokens, pairs, kv, tree, causal)
    assert np.isfinite(one) and one > 0
    if chunks:
        new = [float(n) for n, _ in chunks]
        ctx = [float(c) for _, c in chunks]
        decode = (requests, tokens, pairs, kv)
        mixed = fast.price_mixed(decode, (new, ctx), tree, causal)
        assert mixed == slow.price_mixed(decode, (new, ctx), tree, causal)
        assert mixed > 0


def test_where_the_kernel_does_not_apply_numpy_prices() -> None:
    """MoE experts, measured shape factors and an attention selector beyond two ones keep the
    numpy route (the kernel would be wrong there: it knows none of them)."""
    moe = get_model("qwen3-coder-30b-a3b")
    hw = get_profile("h100-sxm")
    assert PassPricer(hw, moe, DrafterSpec.dflash_for(moe), GroundTruth())._sums is None
    dense = get_model("qwen3-8b")
    shaped = replace(GroundTruth(), gemm_shape_tokens=(1.0, 64.0), gemm_shape_factor=(1.2, 1.0))
    assert PassPricer(hw, dense, DrafterSpec.dflash_for(dense), shaped)._sums is None
    p = PassPricer(hw, dense, DrafterSpec.dflash_for(dense), GroundTruth())
    assert p._sums is not None and int(p._attention.sum()) == 2


def test_the_attention_sum_needs_its_ones() -> None:
    """The kernel sums the attention operators in its own order, exact only for a 0/1 selector
    of at most two ones: with three operators selected, the sum depends on the order, so such
    a selector must not reach it (the check in PassPricer). A negative control: three values
    whose sum in numpy's order differs from the kernel's sequential one."""
    kernel = pass_pricing._pass_sums
    assert kernel is not None
    n = 3
    y = np.array([1.0, 1e-16, 1e-16, 0.0, 0.0, 0.0])  # compute seconds, then memory
    att = np.ones(n)
    _, attention, _ = kernel(y, b"", att, 0)
    assert attention == (1.0 + 1e-16) + 1e-16  # sequential: the small terms vanish
    assert attention != 1.0 + (1e-16 + 1e-16)  # another order keeps them
    two = np.array([1.0, 0.0, 1.0])
    for order in ([0, 1, 2], [2, 1, 0]):
        _, a, _ = kernel(np.concatenate((y[:3][order], y[3:])), b"", two[order], 0)
        assert a == 1.0 + 1e-16  # two ones: the one rounded sum, in any order


def test_sums_as_numpy_reduces_and_propagates_nan() -> None:
    kernel = pass_pricing._pass_sums
    assert kernel is not None
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 8, 9, 16, 19, 33, 130, 300):  # numpy's summation regimes
        y = rng.random(2 * n) * 10.0 ** rng.integers(-9, 3, 2 * n)
        phi = rng.random(n) + 0.5
        att = np.zeros(n)
        att[rng.choice(n, min(n, 2), replace=False)] = 1.0
        per_op = np.maximum(y[:n], y[n:]) * phi
        total, attention, lm = kernel(y, phi, att, n - 1)
        assert total == float(np.add.reduce(per_op[None, :], axis=1)[0])
        assert attention == float((per_op[None, :] @ att)[0])
        assert lm == per_op[n - 1]
        plain, _, _ = kernel(y, b"", att, 0)
        assert plain == float(np.add.reduce(np.maximum(y[:n], y[n:])))
    y = np.array([1.0, np.nan, 0.5, 0.2])
    total, _, _ = kernel(y, b"", np.zeros(2), 0)
    assert np.isnan(total) and np.isnan(np.add.reduce(np.maximum(y[:2], y[2:])))


@pytest.mark.parametrize(
    "y, phi, att, lm",
    [
        (np.zeros(5), b"", np.zeros(2), 0),  # y not 2n
        (np.zeros(4), b"", np.zeros(3), 0),  # attention not n
        (np.zeros(4), np.ones(3), np.zeros(2), 0),  # phi neither empty nor n
        (np.zeros(4), b"", np.zeros(2), 2),  # lm beyond the operators
        (np.zeros(0), b"", np.zeros(0), 0),  # no operator
    ],
)
def test_pass_sums_refuses_mismatched_buffers(y: object, phi: object, att: object, lm: int) -> None:
    kernel = pass_pricing._pass_sums
    assert kernel is not None
    with pytest.raises(ValueError, match="pass_sums"):
        kernel(y, phi, att, lm)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(sorted(_TRUTHS)),
    st.integers(1, 64),
    st.integers(1, 40),
    st.integers(0, 40_000),
    st.booleans(),
    st.lists(st.tuples(st.integers(1, 600), st.integers(0, 9_000)), min_size=1, max_size=3),
)
def test_packed_feature_rows_price_as_fresh_arrays(
    truth: str,
    requests: int,
    per_request: int,
    context: int,
    tree: bool,
    chunks: list[tuple[int, int]],
) -> None:
    """price_pass and price_mixed write their features into kept buffers (struct.pack_into):
    each pass must price as the same features in a fresh np.array do (the reference route
    they replaced), the LM head's row of a mixed pass included, pass after pass."""
    p, _ = _pricers(truth)
    tile = p._tile
    for r in (requests, 1):  # a second pass rewrites the buffers
        tokens = float(r * per_request)
        kv = float(r * context) + tokens
        pairs = tokens * (context + per_request)
        causal = tokens * context + r * per_request * (per_request + 1) / 2.0
        masked = tree or (p.truth.causal_reads_mask and tokens > r)
        f = pairs if masked else causal
        padded = math.ceil(tokens / tile) * tile if tile > 0 else tokens
        x = np.array([[1.0, tokens, padded, f, kv, f if masked else 0.0, 0.0]])
        ref = pass_pricing._price_one(p, x, tokens, 0.0, 1.0 if masked else 0.0)
        assert p.price_pass(r, tokens, pairs, kv, tree, causal) == ref
        new = [float(n) for n, _ in chunks]
        ctx = [float(c) for _, c in chunks]
        q = p.truth.context_quantum
        all_pairs, kv_all = (pairs if masked else causal), kv
        for n, c in zip(new, ctx, strict=True):
            cq = math.ceil(c / q) * q
            all_pairs += n * cq + n * (n + 1.0) / 2.0
            kv_all += cq + n
        total, rows = tokens + sum(new), tokens + len(new)
        pad = math.ceil(total / tile) * tile if tile > 0 else total
        h_pad = math.ceil(rows / tile) * tile if tile > 0 else rows
        x = np.array([[1.0, total, pad, all_pairs, kv_all, pairs if masked else 0.0, 0.0]])
        head = np.array([[1.0, rows, h_pad, 0.0, 0.0, 0.0, 0.0]])
        share = (pairs if masked else 0.0) / all_pairs if all_pairs > 0 else 0.0
        ref = pass_pricing._price_one(p, x, total, 0.0, share, (head, float(rows)))
        assert p.price_mixed((r, tokens, pairs, kv), (new, ctx), tree, causal) == ref
