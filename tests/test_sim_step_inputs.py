"""A serving step's per-request inputs and its close, compiled (``gather()``, ``settle()``) and
in numpy, are the same whole numbers, and a serve is the same with either.

The simulated server gathers, every step, each decoding request's context, the tokens it still
wants, its KV room (−(c + look) mod bt + look) and its last tree size, and after the step keeps
the new tree sizes and finds the requests that reached their output. The compiled calls must
write exactly what numpy's expressions give; inputs they do not take (another dtype, a slot
out of range, read-only outputs, lengths that differ, a negative context) must leave their
outputs untouched and say so, so that numpy answers.
"""

from __future__ import annotations

import numpy as np
import pytest

import bastion.sim.serving as serving
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.policies import make_policy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.serving import serve
from bastion.sim.simulate import SimSpec, calibrated_cost_model, request_source

needs_kernel = pytest.mark.skipif(
    serving._gather is None or serving._settle is None, reason="no compiled kernel"
)


def _numpy_inputs(ctx, out, gen, slots, ids, prev, look, bt):  # type: ignore[no-untyped-def]
    c = ctx[slots]
    return c, out[slots] - gen[slots], (-look - c) % bt + look, prev[ids]


@needs_kernel
def test_gather_writes_numpy_s_numbers() -> None:
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(2, 80))
        ctx = rng.integers(0, 1 << int(rng.integers(1, 40)), n).astype(np.int64)
        out = rng.integers(-50, 5000, n).astype(np.int64)
        gen = rng.integers(-50, 5000, n).astype(np.int64)
        prev = rng.integers(0, 1025, n).astype(np.int64)
        b = int(rng.integers(1, n + 1))
        slots = rng.permutation(n)[:b].astype(np.int64)
        ids = rng.permutation(n)[:b].astype(np.int64)
        look, bt = int(rng.integers(0, 300)), int(rng.choice([1, 7, 16, 256]))
        got = [np.full(b, -7, np.int64) for _ in range(4)]
        want = int(((ctx[slots] + look + bt - 1) // bt).sum())  # KVCache.blocks_of's count
        assert serving._gather(ctx, out, gen, slots, *got[:3], look, bt, prev, ids, got[3]) == want
        for g, w in zip(got, _numpy_inputs(ctx, out, gen, slots, ids, prev, look, bt), strict=True):
            assert np.array_equal(g, w)
        c, w = np.full(b, -7, np.int64), np.full(b, -7, np.int64)  # room and sizes skipped
        assert serving._gather(ctx, out, gen, slots, c, w, None, look, bt, None, None, None) == want
        assert np.array_equal(c, ctx[slots]) and np.array_equal(w, out[slots] - gen[slots])


@needs_kernel
def test_gather_declines_what_it_does_not_take() -> None:
    n = 6
    ctx, out, gen = (
        np.arange(n, dtype=np.int64) * 100,
        np.full(n, 50, np.int64),
        np.ones(n, np.int64),
    )
    slots, prev = np.array([0, 2], np.int64), np.zeros(n, np.int64)
    frozen = np.zeros(2, np.int64)
    frozen.flags.writeable = False

    def outs() -> list[np.ndarray]:
        return [np.full(2, -7, np.int64) for _ in range(4)]

    for change in (
        {"ctx": ctx.astype(np.int32)},
        {"slots": np.array([0, n], np.int64)},
        {"slots": np.array([-1, 0], np.int64)},
        {"ids": np.array([0, n], np.int64)},
        {"ctx": np.concatenate(([-1], ctx[1:]))},
        {"out": out[:-1]},
        {"bt": 0},
        {"bt": 1 << 61},
        {"look": -1},
        {"frozen": 0},
        {"frozen": 2},
        {"short": 1},
    ):
        o = outs()
        if "frozen" in change:
            o[change["frozen"]] = frozen
        if "short" in change:
            o[change["short"]] = np.full(1, -7, np.int64)
        args = {
            "ctx": ctx,
            "out": out,
            "gen": gen,
            "slots": slots,
            "ids": slots,
            "look": 3,
            "bt": 16,
            **{k: v for k, v in change.items() if k not in ("frozen", "short")},
        }
        ok = serving._gather(
            args["ctx"],
            args["out"],
            args["gen"],
            args["slots"],
            o[0],
            o[1],
            o[2],
            args["look"],
            args["bt"],
            prev,
            args["ids"],
            o[3],
        )
        assert ok == -1, change
        assert all((x == -7).all() or x is frozen for x in o), change


@needs_kernel
def test_settle_keeps_the_sizes_and_counts_the_finished() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(2, 80))
        b = int(rng.integers(1, n + 1))
        ids = rng.permutation(n)[:b].astype(np.int64)
        sizes = rng.integers(1, 1025, b).astype(np.int64)
        committed = rng.integers(1, 17, b).astype(np.int64)
        wanted = rng.integers(-3, 30, b).astype(np.int64)
        prev, want = rng.integers(0, 9, n).astype(np.int64), None
        want = prev.copy()
        want[ids] = sizes
        count = serving._settle(prev, ids, sizes, committed, wanted)
        assert count == np.count_nonzero(committed >= wanted) and np.array_equal(prev, want)
        assert serving._settle(None, ids, None, committed, wanted) == count
    ids, one = np.array([0, 1], np.int64), np.ones(2, np.int64)
    frozen = np.zeros(4, np.int64)
    frozen.flags.writeable = False
    for args in (
        (np.zeros(4, np.int64), np.array([0, 4], np.int64), one, one, one),
        (frozen, ids, one, one, one),
        (np.zeros(4, np.int64), ids, one[:1], one, one),
        (np.zeros(4, np.int64), ids, one, one.astype(np.int32), one),
        (None, ids, None, one, one[:1]),
    ):
        assert serving._settle(*args) == -1
        assert args[0] is None or not args[0].any()


@pytest.mark.parametrize("policy", ["bastion", "chain", "fixed:16"])
def test_a_serve_is_the_same_compiled_or_in_numpy(policy: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The whole serve (per request and per step) with the compiled gathers and with numpy's,
    at batch 1 and above, with a KV cache counted (each request's room gathered)."""
    model, hw = get_model("qwen3-8b"), get_profile("h100-sxm")
    drafter = DrafterSpec.dflash_for(model)
    cost_model, _ = calibrated_cost_model(SimulatedGPU(hw, model, drafter))

    def run(c: int):  # type: ignore[no-untyped-def]
        spec = SimSpec(model="qwen3-8b", concurrency=c, requests=6, gpu_memory_utilization=0.9)
        p = make_policy(policy)
        cm = cost_model if getattr(p, "uses_cost_model", False) else None
        memory = spec.memory_plan(getattr(p, "uses_drafter", True))
        r = serve(
            p,
            SimulatedGPU(hw, model, drafter),
            request_source(spec),
            6,
            c,
            cm,
            memory=memory,
        )
        return [(q.tokens, q.end_s) for q in r.requests], r.batch_sizes, r.elapsed_s

    fast = [run(c) for c in (1, 4)]
    monkeypatch.setattr(serving, "_gather", None)
    monkeypatch.setattr(serving, "_settle", None)
    assert [run(c) for c in (1, 4)] == fast
