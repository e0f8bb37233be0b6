"""The simulated GPU's truth: the matrix route equals the per-operator roofline; prefill."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.cost.roofline import PassShape, drafter_pass, price_pass
from bastion.errors import ConfigError
from bastion.sim.gpu import DEFAULT_PREFILL_CHUNK, GroundTruth, SimulatedGPU, causal_chunk_pairs

MODELS = ["qwen3-8b", "qwen3-coder-30b-a3b"]  # dense and MoE


def gpu(model: str = "qwen3-8b", device: str = "h100-sxm", **truth: Any) -> SimulatedGPU:
    m = get_model(model)
    return SimulatedGPU(get_profile(device), m, DrafterSpec.dflash_for(m), GroundTruth(**truth))


def reference(
    g: SimulatedGPU,
    shape: PassShape,
    masked: bool,
    logit_rows: float | None = None,
    tree_share: float = 1.0,
) -> npt.NDArray[np.float64]:
    """The truth through ``price_pass`` operator by operator (the pre-LinearPricer route), with
    the LM head on ``logit_rows`` rows and the tree penalty scaled by ``tree_share``."""
    # the truth's own routing model: uniform at its defaults (no skew, no correlation)
    opt = replace(g.options, expert_touch="uniform")
    ops = price_pass(g.model, g.device, shape, opt, masked=masked).operators
    if logit_rows is not None:
        zero = np.zeros(())
        rows = PassShape(np.asarray(logit_rows), zero, zero, zero)
        head = price_pass(g.model, g.device, rows, opt, masked=masked).op("lm_head")
        ops = tuple(head if op.name == "lm_head" else op for op in ops)
    total = np.zeros(np.shape(shape.tokens))
    for op in ops:
        t = op.time_s
        if masked and op.name in ("attn_scores", "attn_values"):
            t = t * (1.0 + g.truth.tree_attention_penalty * tree_share)
        total = total + t
    tile, step = g.truth.tile_tokens, g.truth.tile_step_s
    if tile and step:
        total = total + g.model.layers * step * (np.ceil(np.asarray(shape.tokens) / tile) - 1.0)
    return np.asarray(total, dtype=np.float64)


def close(a: npt.ArrayLike, b: npt.ArrayLike) -> None:
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-12, atol=0)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tile", [64, 0])
def test_matrix_truth_equals_price_pass_route(model: str, tile: int) -> None:
    """LinearPricer with the per-operator penalty gives the price_pass numbers (1e-12 rel)."""
    g = gpu(model, noise=0.0, tile_tokens=tile)
    rng = np.random.default_rng(7)
    for _ in range(25):
        b = int(rng.integers(1, 65))
        s = rng.integers(1, 200, b)
        c = rng.integers(0, 20_000, b)
        cq = g.sums.quantise(c)
        close(g.verify_truth(s, c), reference(g, PassShape.of_batch(s, cq, masked=True), True))
        ones = np.ones(b)
        close(g.ar_truth(c), reference(g, PassShape.of_batch(ones, cq, masked=False), False))
    # the cached batch-1 curve, priced as one vectorised shape
    curve = g.verify_curve(3000)
    sizes = np.arange(1, g.max_tree_size + 1, dtype=np.float64)
    close(curve, reference(g, PassShape.of([(sizes, g.sums.quantise(3000))], masked=True), True))


@pytest.mark.parametrize("model", MODELS)
def test_mixed_pass_equals_its_price_pass_reference(model: str) -> None:
    """A decode step with prefill chunks: T and attention pairs include the chunks (causal
    pairs n·c + n(n+1)/2, no mask), the LM head runs on one row per chunk, and the tree penalty
    is scaled by the trees' share of the attention pairs."""
    g = gpu(model, noise=0.0)
    rng = np.random.default_rng(11)
    for _ in range(10):
        b, k = int(rng.integers(1, 33)), int(rng.integers(1, 4))
        s, c = rng.integers(1, 100, b).astype(float), g.sums.quantise(rng.integers(0, 8000, b))
        n, pc = rng.integers(1, 1024, k).astype(float), g.sums.quantise(rng.integers(0, 8000, k))
        chunk_pairs = float(np.sum(n * pc + n * (n + 1) / 2))
        for masked, tokens in ((True, s), (False, np.ones(b))):
            tree_pairs = float(np.dot(tokens, c + tokens))
            kv = float(np.sum(c + tokens) + np.sum(pc + n))
            shape = PassShape(
                tokens=np.asarray(tokens.sum() + n.sum()),
                attn_pairs=np.asarray(tree_pairs + chunk_pairs),
                kv_tokens=np.asarray(kv),
                mask_elems=np.asarray(tree_pairs if masked else 0.0),
            )
            share = tree_pairs / (tree_pairs + chunk_pairs)
            want = reference(g, shape, masked, logit_rows=tokens.sum() + k, tree_share=share)
            got = g.verify_truth(s, c, n, pc) if masked else g.ar_truth(c, n, pc)
            close(got, want)
        prefill = PassShape(
            tokens=np.asarray(n.sum()),
            attn_pairs=np.asarray(chunk_pairs),
            kv_tokens=np.asarray(np.sum(pc + n)),
            mask_elems=np.zeros(()),
        )
        close(g.prefill_truth(n, pc), reference(g, prefill, False, logit_rows=float(k)))


def test_causal_chunk_pairs_count_the_keys_each_token_sees() -> None:
    for n, c in [(1, 0), (1, 100), (7, 0), (64, 1000), (512, 3)]:
        assert causal_chunk_pairs(n, c) == sum(c + j for j in range(1, n + 1))
    np.testing.assert_array_equal(causal_chunk_pairs([2, 3], [0, 10]), [3, 36])


def test_prefill_is_monotone_in_tokens_and_context() -> None:
    g = gpu(noise=0.0)
    tokens = [1, 2, 16, 63, 64, 65, 128, 512, 513, 2048, 8192]
    by_tokens = [g.prefill_truth([n], [1000]) for n in tokens]
    assert np.all(np.diff(by_tokens) > 0)
    contexts = [0, 1, 16, 17, 500, 4096, 32_768, 131_072]
    by_context = [g.prefill_truth([512], [c]) for c in contexts]
    assert np.all(np.diff(by_context) >= 0)  # contexts are priced per 16-token bucket
    assert by_context[-1] > by_context[0] * 1.5  # long contexts make attention dominate
    # more chunks in one pass cost more than fewer
    assert g.prefill_truth([512, 512], [0, 0]) > g.prefill_truth([512], [0])


@pytest.mark.parametrize("model", MODELS)
def test_chunk_riding_with_decode_is_cheaper_than_two_passes(model: str) -> None:
    g = gpu(model, noise=0.0)
    trees, ctx = [16] * 32, [2000] * 32
    chunk, chunk_ctx = [DEFAULT_PREFILL_CHUNK], [1024]
    alone = g.prefill_truth(chunk, chunk_ctx)
    for step, mixed in (
        (g.verify_truth(trees, ctx), g.verify_truth(trees, ctx, chunk, chunk_ctx)),
        (g.ar_truth(ctx), g.ar_truth(ctx, chunk, chunk_ctx)),
    ):
        assert max(step, alone) < mixed < step + alone


def test_defaults_and_empty_decode() -> None:
    g = gpu(noise=0.0)
    assert DEFAULT_PREFILL_CHUNK == 512
    # no chunks: exactly the decode-only truth (default arguments, or empty sequences)
    assert g.verify_truth([8, 9], [100, 200], [], []) == g.verify_truth([8, 9], [100, 200])
    assert g.ar_truth([100, 200], np.zeros(0), np.zeros(0)) == g.ar_truth([100, 200])
    # chunks with no decode request: the pass is a prefill pass
    close(g.verify_truth([], [], [300], [40]), g.prefill_truth([300], [40]))
    close(g.ar_truth([], [300], [40]), g.prefill_truth([300], [40]))


def test_prefill_noise_is_seeded() -> None:
    a, b = gpu(noise=0.05), gpu(noise=0.05)
    xs = [a.prefill_s([512], [0]) for _ in range(3)] + [a.verify_s([4], [9], [7], [0])]
    ys = [b.prefill_s([512], [0]) for _ in range(3)] + [b.verify_s([4], [9], [7], [0])]
    assert xs == ys and len(set(xs)) == 4
    assert gpu(noise=0.0).ar_s([5], [6], [7]) == gpu(noise=0.0).ar_truth([5], [6], [7])


@pytest.mark.parametrize(
    ("tokens", "contexts"),
    [([512], [0, 0]), ([0], [0]), ([512], [-1]), ([1.5], [0]), ([np.nan], [0]), ([[1]], [[1]])],
)
def test_bad_prefill_chunks(tokens: list[float], contexts: list[float]) -> None:
    g = gpu(noise=0.0)
    with pytest.raises(ConfigError, match="prefill"):
        g.prefill_truth(tokens, contexts)
    with pytest.raises(ConfigError, match="prefill"):
        g.verify_truth([4], [100], tokens, contexts)


def test_a_prefill_pass_needs_a_chunk() -> None:
    with pytest.raises(ConfigError, match="at least one chunk"):
        gpu().prefill_truth([], [])
    with pytest.raises(ConfigError, match="tree sizes"):
        gpu().verify_truth([4, 4], [100], [8], [0])


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tile", [64, 0])
def test_draft_truth_equals_drafter_pass(model: str, tile: int) -> None:
    """The per-batch-size affine route gives drafter_pass's numbers (1e-12 rel), also for a
    drafter with MoE layers (experts touched depend on the batch size alone)."""
    m = get_model(model)
    for drafter in (DrafterSpec.dflash_for(m), DrafterSpec(model=m, block_size=8, taps=3)):
        g = SimulatedGPU(get_profile("h100-sxm"), m, drafter, GroundTruth(tile_tokens=tile))
        rng = np.random.default_rng(5)
        for _ in range(20):
            b = int(rng.integers(1, 80))
            c = rng.integers(0, 40_000, b)
            want = drafter_pass(drafter, g.device, list(g.sums.quantise(c)), g.options).total_s
            close(g.draft_truth(c), want)
            close(g.draft_truth(c.tolist()), want)


def test_batch_inputs_lists_arrays_and_one_request() -> None:
    g = gpu(noise=0.0)
    rng = np.random.default_rng(9)
    s, c = rng.integers(1, 65, 20), rng.integers(256, 4097, 20)
    assert g.verify_truth(s, c) == g.verify_truth(s.tolist(), c.tolist())
    assert g.verify_truth(s, c) == g.verify_truth(s.astype(float), c.astype(float))
    assert g.ar_truth(c) == g.ar_truth(c.tolist())
    # one request: the cached curve (or cache) agrees with the batched route's numbers
    for size, ctx in [(1, 0), (16, 1000), (1024, 77), (1500, 4096)]:
        shape = PassShape.of_batch([size], g.sums.quantise([ctx]), masked=True)
        close(g.verify_truth([size], [ctx]), reference(g, shape, True))
        close(g.verify_truth(np.array([size]), np.array([ctx])), reference(g, shape, True))
    assert g.verify_truth([5000], 100) == g.verify_truth([5000], [100])  # past the curve
    ar = PassShape.of_batch([1.0], g.sums.quantise([999]), masked=False)
    close(g.ar_truth([999]), reference(g, ar, False))
    close(g.ar_truth(999), reference(g, ar, False))


@pytest.mark.parametrize(
    ("sizes", "contexts", "match"),
    [
        ([4, 0], [10, 10], "s ≥ 1"),
        ([4, 4], [10, -20], "c ≥ 0"),
        ([4, 4], [10], "tree sizes"),
        ([], [], "at least one request"),
        ([[4]], [[10]], "1-D"),
    ],
)
def test_bad_decode_requests(sizes: list[int], contexts: list[int], match: str) -> None:
    g = gpu(noise=0.0)
    with pytest.raises(ConfigError, match=match):
        g.verify_truth(sizes, contexts)
    if match in ("c ≥ 0", "at least one request"):
        with pytest.raises(ConfigError, match=match):
            g.ar_truth(contexts)
        with pytest.raises(ConfigError, match=match):
            g.draft_truth(contexts)


def test_noise_is_the_generators_normals_drawn_in_blocks() -> None:
    """Pass i is scaled by exp(σ·z_i), z the generator's standard normals in order (drawn 1024
    at a time): a function of the seed alone, across block boundaries."""
    g = gpu(noise=0.05)
    got = [g.verify_s([16], [512]) / g.verify_truth([16], [512]) for _ in range(2500)]
    z = np.random.default_rng([0, 0x6775]).standard_normal(2500)
    np.testing.assert_allclose(got, np.exp(0.05 * z), rtol=1e-14)


def test_prep_truth_takes_arrays_lists_and_scalars() -> None:
    g = gpu(noise=0.0)
    sizes = np.array([3, 17, 64])
    assert g.prep_truth(sizes) == g.prep_truth(sizes.tolist()) == g.prep_truth(sizes * 1.0)
    assert g.prep_truth(sizes, topk=False) == g.prep_truth([1, 1, 1], False)
    assert g.prep_truth(5) == g.prep_truth([5])
    assert g.prep_s(sizes) == g.prep_truth(sizes)  # noise off


# --- byte widths and a host that adds (a CPU truth) --------------------------------------------


def _passes(g: SimulatedGPU) -> list[float]:
    """A few passes of every kind: batch-1 curve, batched tree and chain, AR, mixed, draft, prep."""
    s, c = np.array([3, 40, 7]), np.array([100, 2000, 513])
    return [
        *g.verify_curve(512)[[0, 15, 63, 255]].tolist(),
        g.verify_truth(s, c),
        g.verify_truth(s, c, tree=False),
        g.ar_truth(c),
        g.ar_truth([77]),
        g.verify_truth(s, c, [256], [0]),
        g.prefill_truth([512], [1024]),
        g.draft_truth(c),
        g.draft_truth([300]),
        g.prep_truth(s, contexts=c),
        g.prep_truth(s, topk=False),
    ]


@pytest.mark.parametrize("truth", ["hf-eager", "cudagraph", "builtin"])
def test_two_byte_widths_and_no_host_adds_are_the_defaults_bit_for_bit(truth: str) -> None:
    """weight_bytes / activation_bytes 0 (absent) and 2 price exactly as before; host_adds
    false is the overlap of host and device."""
    from bastion.sim.truth import get_truth

    m = get_model("qwen3-coder-30b-a3b")
    base = get_truth(truth)
    assert (base.weight_bytes, base.activation_bytes, base.host_adds) == (0.0, 0.0, False)
    said = replace(base, weight_bytes=2.0, activation_bytes=2.0, host_adds=False)

    def make(t: GroundTruth) -> SimulatedGPU:
        return SimulatedGPU(get_profile("h100-sxm"), m, DrafterSpec.dflash_for(m), t)

    assert make(said).options == make(base).options
    assert _passes(make(said)) == _passes(make(base))


def test_weight_bytes_4_doubles_a_memory_bound_pass() -> None:
    """An fp32 model: a batch-1 decode step of qwen3-8b reads its weights, so its device time
    (the pass less its fixed kernel launches) doubles; the truth still equals the per-operator
    roofline at those widths."""
    two, four = gpu(noise=0.0, tile_tokens=0), gpu(noise=0.0, tile_tokens=0, weight_bytes=4.0)
    assert four.options.bytes_per_param == 4.0 and four.options.bytes_per_act == 2.0
    launch = two.pricer._launch_plain
    assert launch == four.pricer._launch_plain
    ratio = (four.ar_truth([64]) - launch) / (two.ar_truth([64]) - launch)
    assert 1.95 < ratio <= 2.0
    c = np.array([64.0])
    ref = reference(four, PassShape.of_batch(np.ones(1), c, masked=False), False)
    close(four.ar_truth([64]), ref)
    drafted = drafter_pass(four.drafter, four.device, [64.0], four.options).total_s
    close(four.draft_truth([64]), drafted)
    assert four.draft_truth([64]) > 1.5 * two.draft_truth([64])


def test_activation_bytes_price_the_kv_cache() -> None:
    """activation_bytes is the KV cache's width too: a long-context batch reads mostly KV and
    slows by far more than a one-token step over an empty cache."""
    two, four = gpu(noise=0.0, tile_tokens=0), gpu(noise=0.0, tile_tokens=0, activation_bytes=4.0)
    long = np.full(32, 16_000)
    assert four.ar_truth(long) > 1.5 * two.ar_truth(long)
    assert four.ar_truth([0]) < 1.02 * two.ar_truth([0])
    assert four.prep_truth([16], contexts=[100]) > two.prep_truth([16], contexts=[100])


@pytest.mark.parametrize("model", MODELS)
def test_host_adds_makes_a_pass_host_plus_device(model: str) -> None:
    """host_adds: pass = overhead + host dispatch + device work (a CPU does both); without it
    the two overlap: overhead + max(host, device)."""
    host_layer, overhead = 4e-3, 1e-4
    device = gpu(model, noise=0.0, pass_overhead_s=overhead)  # no host time
    adds = gpu(model, noise=0.0, pass_overhead_s=overhead, host_layer_s=host_layer, host_adds=True)
    overlaps = gpu(model, noise=0.0, pass_overhead_s=overhead, host_layer_s=host_layer)
    host = device.model.layers * host_layer
    s, c = np.array([3, 40]), np.array([100, 2000])
    for name, args in [
        ("verify_truth", (s, c)),
        ("verify_truth", ([16], [512])),
        ("ar_truth", (c,)),
        ("verify_truth", (s, c, [64], [0])),
    ]:
        alone = getattr(device, name)(*args) - overhead
        close(getattr(adds, name)(*args), overhead + alone + host)
        close(getattr(overlaps, name)(*args), overhead + max(alone, host))
    drafter_host = device.drafter.model.layers * host_layer
    alone = device.draft_truth(c) - overhead
    close(adds.draft_truth(c), overhead + alone + drafter_host)
    close(overlaps.draft_truth(c), overhead + max(alone, drafter_host))
