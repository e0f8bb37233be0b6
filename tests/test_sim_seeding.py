"""The simulator's cheap seeding (``bastion.sim.seeding.seeded``) against numpy's own.

A request's generator must start exactly where ``np.random.default_rng([seed, index, …])``
starts — its PCG64 state and therefore every draw — whether it is new or a kept generator
re-stated; entropies outside the fast path (negative, not integers) get numpy's own errors. The
request lengths' one-request path of ``Workload.sample_lengths`` is checked against the formula
numpy evaluates for any n."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bastion.sim import seeding
from bastion.sim.seeding import seeded
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload

_EDGES = [0, 1, 2**31, 2**32 - 1, 2**32, 2**64 - 1, 2**64, 2**100 + 7]


def _same_as_numpy(entropy: list[int], generator: np.random.Generator | None) -> None:
    ours = seeded(entropy, generator)
    ref = np.random.default_rng(list(entropy))
    assert ours.bit_generator.state == ref.bit_generator.state
    assert np.array_equal(ours.random(7), ref.random(7))
    assert np.array_equal(ours.standard_normal(5), ref.standard_normal(5))
    if generator is not None:
        assert ours is generator  # re-stated, not replaced


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(0, 2**32 - 1), st.sampled_from(_EDGES), st.integers(0, 2**130)),
        max_size=7,  # past the pool's 4 words: the remaining entropy mixed in
    ),
    st.booleans(),
)
def test_seeded_is_default_rng(entropy: list[int], keep: bool) -> None:
    kept = np.random.default_rng(12345) if keep else None
    if kept is not None:
        kept.random(3)  # a used generator: nothing of its state may survive
    _same_as_numpy(entropy, kept)


def test_numpy_integers_and_tuples() -> None:
    _same_as_numpy([np.int64(7), np.uint32(2**32 - 1)], None)  # type: ignore[list-item]
    ours = seeded((3, 9), None)
    assert ours.bit_generator.state == np.random.default_rng([3, 9]).bit_generator.state


def test_the_seed_sequence_words_cycle_the_pool() -> None:
    kernel = seeding._seed_words
    if kernel is None:
        pytest.skip("built without the compiled kernel")
    for entropy in ([0, 5], [1, 2, 3, 4, 5, 6], [2**32 - 1]):
        words = np.array(entropy, np.uint32).tobytes()
        for n in (0, 1, 4, 8, 13):
            got = np.frombuffer(kernel(words, n), np.uint32)
            want = np.random.SeedSequence(entropy).generate_state(n, np.uint32)
            assert np.array_equal(got, want)
    with pytest.raises(ValueError):
        kernel(b"\x00" * 6, 4)  # not whole 32-bit words
    with pytest.raises(ValueError):
        kernel(b"\x00" * 8, -1)


@pytest.mark.parametrize("entropy", [[-1, 3], [1.5, 2], ["x"]])
def test_other_entropies_get_numpys_errors(entropy: list[object]) -> None:
    with pytest.raises((ValueError, TypeError)) as ours:
        seeded(entropy)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError)) as theirs:
        np.random.default_rng(entropy)  # type: ignore[arg-type]
    assert type(ours.value) is type(theirs.value)


def test_without_the_kernel_numpy_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seeding, "_seed_words", None)
    kept = np.random.default_rng(1)
    ours = seeded([4, 2], kept)
    assert ours.bit_generator.state == np.random.default_rng([4, 2]).bit_generator.state


def test_a_non_pcg64_generator_is_not_restated() -> None:
    other = np.random.Generator(np.random.MT19937(3))
    ours = seeded([4, 2], other)
    assert ours is not other
    assert ours.bit_generator.state == np.random.default_rng([4, 2]).bit_generator.state


def test_a_reused_slot_draws_what_a_fresh_source_draws() -> None:
    """The source re-seeds a slot's kept generator for its next request: the request's stream
    is the one a fresh source gives it (and its lengths too)."""
    w = dataclasses.replace(get_workload("chat"), prompt_len_sigma=1.0, output_len_sigma=0.8)
    used = SyntheticSource(w, seed=11)
    slots = np.array([0], np.int64)
    ctx = np.zeros(1, np.int64)
    used.admit(0, 3)
    for _ in range(70):  # past a block: the kept generator has moved on
        used.draft(slots, ctx)
    used.lengths(3)
    used.admit(0, 9)
    fresh = SyntheticSource(w, seed=11)
    fresh.admit(0, 9)
    for _ in range(70):
        a, ta = used.draft(slots, ctx)
        b, tb = fresh.draft(slots, ctx)
        assert np.array_equal(a.probs, b.probs) and np.array_equal(ta, tb)
    assert used.lengths(9) == fresh.lengths(9) == SyntheticSource(w, seed=11).lengths(9)


def _lengths_reference(w, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """sample_lengths as its docstring states it, row by row in numpy."""
    z = rng.standard_normal((2, n))
    out = []
    for row, median, sigma, high in (
        (0, w.prompt_len, w.prompt_len_sigma, w.prompt_len_max),
        (1, w.output_len, w.output_len_sigma, w.output_len_max),
    ):
        out.append(np.clip(np.rint(median * np.exp(sigma * z[row])), 1, high).astype(np.int64))
    return out[0], out[1]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["chat", "math", "code"]),
    st.floats(0.0, 4.0),
    st.floats(0.0, 4.0),
    st.integers(1, 4000),
    st.integers(1, 6000),
    st.sampled_from([1, 1, 1, 2, 5]),
    st.integers(0, 2**32 - 1),
)
def test_sample_lengths_is_its_formula(
    name: str, ps: float, os_: float, pm: int, om: int, n: int, seed: int
) -> None:
    base = get_workload(name)
    w = dataclasses.replace(
        base,
        prompt_len=pm,
        output_len=om,
        prompt_len_sigma=ps,
        output_len_sigma=os_,
        prompt_len_max=max(pm, 3000),
        output_len_max=max(om, 5000),
    )
    got = w.sample_lengths(np.random.default_rng(seed), n)
    want = _lengths_reference(w, np.random.default_rng(seed), n)
    for g, e in zip(got, want, strict=True):
        assert g.dtype == np.int64 and g.shape == (n,)
        assert np.array_equal(g, e)


class _FixedNormals:
    """A generator whose standard normals are given (sample_lengths draws only those)."""

    def __init__(self, z: list[float]) -> None:
        self.z = z

    def standard_normal(self, shape: tuple[int, int]) -> np.ndarray:
        return np.array(self.z, np.float64).reshape(shape)


def test_one_request_lengths_round_half_to_even() -> None:
    """A length exactly halfway between two integers rounds to the even one, as np.rint does:
    with median 1 and σ = 1, z = log(x) for x where numpy's exp gives back x exactly."""
    w = dataclasses.replace(
        get_workload("math"),
        prompt_len=1,
        output_len=1,
        prompt_len_sigma=1.0,
        output_len_sigma=1.0,
    )
    halves = [x for x in (2.5, 3.5, 4.5, 5.5, 6.5, 7.5) if np.exp(np.log(x)) == x]
    assert len(halves) >= 2  # (else the check below would test nothing)
    for a, b in itertools.pairwise(halves):
        z = [float(np.log(a)), float(np.log(b))]
        p, o = w.sample_lengths(_FixedNormals(z), 1)  # type: ignore[arg-type]
        assert (int(p[0]), int(o[0])) == (int(np.rint(a)), int(np.rint(b)))
        assert {int(p[0]) % 2, int(o[0]) % 2} == {0}  # halves went to the even neighbour


@pytest.mark.parametrize("name", ["chat", "math", "code"])
def test_a_sources_lengths_are_the_formulas(name: str) -> None:
    """SyntheticSource.lengths (the one-request path, Python numbers) gives the formula's
    lengths from the request's own generator, default_rng([seed, index, 0x6C656E])."""
    w = get_workload(name)
    source = SyntheticSource(w, seed=5)
    for index in range(200):
        want = _lengths_reference(w, np.random.default_rng([5, index, 0x6C656E]), 1)
        got = source.lengths(index)
        assert type(got[0]) is int and type(got[1]) is int
        assert got == (int(want[0][0]), int(want[1][0]))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(0, 2**32 - 1), st.sampled_from(_EDGES), st.integers(0, 2**64 - 1)),
        max_size=17,  # past the kernel's 16 entries too
    ),
    st.booleans(),
)
def test_the_compiled_seed_state_is_numpys(entropy: list[int], as_tuple: bool) -> None:
    """seed_state gives numpy's PCG64 state and increment for ints below 2**64, and None (the
    Python path) for anything else."""
    kernel = seeding._seed_state
    if kernel is None:
        pytest.skip("built without the compiled kernel")
    made = kernel(tuple(entropy) if as_tuple else list(entropy))
    if len(entropy) > 16 or any(v >= 2**64 for v in entropy):
        assert made is None
        return
    want = np.random.default_rng(list(entropy)).bit_generator.state["state"]
    assert made == (want["state"], want["inc"])


def test_the_compiled_seed_state_declines_others() -> None:
    kernel = seeding._seed_state
    if kernel is None:
        pytest.skip("built without the compiled kernel")
    for entropy in ((-1, 3), (1.5,), (np.int64(3),), (True,), "ab", 7, (2**64,)):
        assert kernel(entropy) is None


def test_without_the_compiled_state_python_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seeding, "_seed_state", None)
    kept = np.random.default_rng(1)
    for entropy in ([4, 2], [0], [2**40, 2**63, 5]):
        ours = seeded(entropy, kept)
        assert ours.bit_generator.state == np.random.default_rng(entropy).bit_generator.state
