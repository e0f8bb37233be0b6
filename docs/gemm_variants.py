"""GEMM kernel-model variants tried against the model family's floor (docs/cost-model.md).

Not part of the library: each variant is a change to :func:`bastion.cost.kernels.gemm_time`
that was measured (in-sample floor and leave-one-GPU-out, ``python docs/make_transfer_table.py
--floor --variant NAME``) and *not adopted*; they are kept so the documented numbers can be
reproduced. ``base`` is the library's formula, written out again (a test checks it equals
``gemm_time``, so this file cannot drift from the library silently).

Every variant reads the architecture from the profile's name (``h100``/``h200`` → Hopper), which
is good enough for the three shipped tables and nothing else; an adopted variant would need an
``architecture`` key in ``hwprofiles/``.

- ``base``: the library.
- ``stream-k`` (Hopper): the full waves run as data-parallel tiles, the last partial wave is
  spread over every SM stream-K style (its work / SMs, plus two tiles' fixed cycles for the
  partial tiles' prologues and fix-up) instead of costing a whole tile time.
- ``hopper-tiles`` (Hopper): CUTLASS sm90's warpgroup shapes: no 32-token tile, a 64×256 one.
- ``arch-tiles``: per-architecture sets in the library's (tokens, weights) order, which is the
  kernel's (N, M) for y = x·Wᵀ: Ampere 64×64, 64×128, 128×64, 128×128, 128×256, 256×128;
  Hopper the 64×N warpgroup tiles (N = 64, 128, 256 weights) and 128×128, 128×256, 256×128.
- ``cluster-pairs`` (Hopper): a 2-CTA cluster along the tokens: token tiles rounded up to even.
- ``padded-feed``: a tile's feed moves its whole BM-row box (TMA and predicated cp.async fill
  the out-of-range rows with zeros in shared memory), not only its real rows.
- ``pipeline-fill``: the first k-block of a tile's mainloop is not overlapped:
  t_tile = body · (1 + BK / (K/s)) + fixed, BK = 32 on Ampere, 64 on Hopper (their libraries'
  default 16-bit k-blocks); ``pipeline-fill-64``: BK = 64 everywhere; ``pipeline-fill-feed``:
  the first k-block's *feed* only, t_tile = body + feed · 64 / (K/s) + fixed.
- ``least-padded-work``: the library's pick is the configuration with the least padded work
  per SM (waves × BM·BN·K/s), not the cheapest; ``split-k-if-short``: split-K only where the
  unsplit grid does not fill the SMs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt

import bastion.cost.kernels as kernels
from bastion.cost.kernels import TILE_CONFIGS, KernelDevice, KernelParams

Array = npt.NDArray[np.float64]

VARIANTS = (
    "base",
    "stream-k",
    "hopper-tiles",
    "arch-tiles",
    "cluster-pairs",
    "padded-feed",
    "pipeline-fill",
    "pipeline-fill-64",
    "pipeline-fill-feed",
    "least-padded-work",
    "split-k-if-short",
)

_HOPPER_TILES = ((64, 64), (64, 128), (64, 256), (128, 64), (128, 128), (128, 256), (256, 128))
_ARCH_TILES = {
    False: ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128)),
    True: ((64, 64), (128, 64), (256, 64), (128, 128), (256, 128), (128, 256)),
}


def is_hopper(dev: KernelDevice) -> bool:
    return dev.name.startswith(("h100", "h200"))


def configs(variant: str, hopper: bool) -> Array:
    """[configurations, 3]: (tokens per tile, weights per tile, split-K)."""
    if variant == "hopper-tiles" and hopper:
        shapes: tuple[tuple[int, int], ...] = _HOPPER_TILES
    elif variant == "arch-tiles":
        shapes = _ARCH_TILES[hopper]
    else:
        return np.array([(c.m, c.n, c.split_k) for c in TILE_CONFIGS], dtype=np.float64)
    return np.array([(m, n, s) for m, n in shapes for s in (1, 2, 4)], dtype=np.float64)


def gemm_time_variant(
    variant: str,
    tokens: npt.ArrayLike,
    k_in: int,
    n_out: int,
    dev: KernelDevice,
    params: KernelParams,
    bytes_per_elem: float = 2.0,
    groups: npt.ArrayLike = 1.0,
) -> Array:
    """Seconds of y[M, N] = x[M, K]·W[K, N] under ``variant`` (module docstring)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    hopper = is_hopper(dev)
    cfg = configs(variant, hopper)
    m = np.maximum(np.asarray(tokens, dtype=np.float64), 1.0)[..., None]
    g = np.asarray(groups, dtype=np.float64)[..., None]
    bm, bn, s = cfg[:, 0], cfg[:, 1], cfg[:, 2]
    k_split = np.ceil(k_in / s)
    p, bp = params, bytes_per_elem
    token_tiles = np.ceil(m / bm)
    if variant == "cluster-pairs" and hopper:
        token_tiles = 2.0 * np.ceil(token_tiles / 2.0)
    tiles = g * token_tiles * np.ceil(n_out / bn) * s
    compute = 2.0 * bm * bn * k_split / (p.tensor_efficiency * dev.peak_per_sm)
    rows = m / np.ceil(m / bm)
    if variant == "padded-feed":
        rows = np.broadcast_to(bm, rows.shape)
    feed = (rows + bn) * k_split * bp / (p.l2_bytes_per_flop * dev.peak_per_sm)
    body = np.maximum(compute, feed)
    fixed = p.tile_cycles / dev.clock_hz
    t_tile = body + fixed
    if variant in ("pipeline-fill", "pipeline-fill-64"):
        bk = 64.0 if hopper or variant == "pipeline-fill-64" else 32.0
        t_tile = body * (1.0 + bk / k_split) + fixed
    elif variant == "pipeline-fill-feed":
        t_tile = body + feed * 64.0 / k_split + fixed
    waves = np.ceil(tiles / dev.sms)
    compute_time = waves * t_tile
    if variant == "stream-k" and hopper:
        full = np.floor(tiles / dev.sms)
        rest = tiles - full * dev.sms
        compute_time = full * t_tile + np.where(rest > 0, rest / dev.sms * body + 2.0 * fixed, 0.0)
    act = g * m * k_in * bp
    usable = p.l2_fraction * dev.l2_bytes
    partials = np.where(s > 1, 4.0 * g * m * n_out * s, 0.0)
    dram = (
        g * k_in * n_out * bp
        + act * np.where(act <= usable, 1.0, waves)
        + g * m * n_out * bp
        + np.where(partials <= usable, 0.0, 2.0 * partials)
    )
    dram_time = dram / (p.dram_efficiency * dev.dram_bandwidth)
    t = np.maximum(compute_time, dram_time) + p.kernel_s * np.where(s > 1, 2.0, 1.0)
    if variant == "least-padded-work":
        pick = np.argmin(waves * bm * bn * k_split + 0.0 * t, axis=-1)
    else:
        if variant == "split-k-if-short":
            unsplit = g * token_tiles * np.ceil(n_out / bn)
            t = np.where((s > 1) & (unsplit >= dev.sms), np.inf, t)
        pick = np.argmin(t, axis=-1)
    return np.asarray(np.take_along_axis(t, pick[..., None], axis=-1)[..., 0], dtype=np.float64)


@contextmanager
def use_variant(variant: str) -> Iterator[None]:
    """Price every GEMM of :mod:`bastion.cost.kernels` with ``variant`` inside the block."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; accepted: {', '.join(VARIANTS)}")
    original = kernels.gemm_time
    if variant == "base":
        yield
        return

    def patched(  # type: ignore[no-untyped-def]
        tokens, k_in, n_out, dev, params, bytes_per_elem=2.0, groups=1.0, return_config=False
    ):
        if return_config:
            raise NotImplementedError("a variant does not report its configuration")
        return gemm_time_variant(variant, tokens, k_in, n_out, dev, params, bytes_per_elem, groups)

    kernels.gemm_time = patched  # type: ignore[assignment]
    try:
        yield
    finally:
        kernels.gemm_time = original
