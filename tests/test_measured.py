"""A measured truth (bastion.sim.measured): fitted from step samples, written, read back, priced.

Every test here makes its own "machine": a known cost function generates the samples, so the
fit is checked against a truth the code never saw in any shipped file.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tomllib

from bastion.errors import ConfigError
from bastion.sim.gpu import GroundTruth, SimulatedGPU
from bastion.sim.measured import Curve, MeasuredCosts, measured_from_dict
from bastion.sim.measured_file import measured_truth_toml
from bastion.sim.measured_fit import fit_measured
from bastion.sim.truth import truth_from_dict
from bastion.stepcosts import PrefillSample, StepSample


def machine_verify(kind: str, rows: int, size: int, context: int) -> float:
    """The pretend machine's verifier call: a concave GEMM curve in tokens, a per-row cost, an
    attention term; AR is a little cheaper per token (no mask)."""
    tokens = rows * (1 if kind == "ar" else size)
    gemm = 3e-3 + 4e-4 * tokens**0.8
    mask = 0.0 if kind == "ar" else 1e-4
    return gemm + mask + 5e-5 * (rows - 1) + 2e-9 * rows * size * (context + size)


def machine_draft(prep: str, contexts: list[int]) -> float:
    return (2e-3 if prep == "topk" else 1.6e-3) + 4e-4 * (len(contexts) - 1) + 1e-7 * sum(contexts)


def machine_host(
    kind: str, control: str, sizes: list[int], builder: str = ""
) -> tuple[float, float]:
    build = {"ar": 2e-5, "chain": 6e-5, "tree": 9e-5}[kind] + 3e-6 * sum(sizes)
    build *= 2.5 if builder == "beam" else 1.0  # a beam builds its rectangle slower
    build += {"static": 0.0, "decide": 2e-4, "repeat": 5e-5}[control]
    # the joint decision over a batch: a path a single request's decision does not take
    build += BATCHED_DECISION_S if control == "decide" and len(sizes) > 1 else 0.0
    loop = 8e-5 + 1e-5 * len(sizes) + (4e-5 if control != "static" else 0.0)
    return build, loop


BATCHED_DECISION_S = 8e-4


def machine_prefill(n: int) -> float:
    return 4e-3 + 6e-5 * n + 1e-8 * n * n


def make_samples(
    seed: int = 0, noise: float = 0.02
) -> tuple[list[StepSample], list[PrefillSample]]:
    rng = np.random.default_rng(seed)
    jitter = lambda: float(np.exp(noise * rng.standard_normal()))  # noqa: E731
    steps = []
    policies = [("ar", "none", "static", 1), ("chain", "argmax", "static", 16)]
    policies += [("tree", "topk", "static", n) for n in (2, 4, 8, 16, 32, 64, 128)]
    policies += [("tree", "topk", "decide", 24), ("ar", "none", "decide", 1)]
    policies += [("tree", "topk", "repeat", 24), ("chain", "topk", "decide", 16)]
    policies += [("tree", "topk", "static", 17)]  # beam:2x8 (its own builder), below
    for i, (kind, prep, control, size) in enumerate(policies):
        builder = "beam" if i == len(policies) - 1 else ""
        for rows in (1, 2, 3, 4):
            for _ in range(6):
                contexts = rng.integers(60, 220, rows).tolist()
                sizes = [size] * rows
                build, loop = machine_host(kind, control, sizes, builder)
                draft = 0.0 if kind == "ar" else machine_draft(prep, contexts) * jitter()
                steps.append(
                    StepSample(
                        kind,
                        prep,
                        control,
                        tuple(sizes),
                        tuple(contexts),
                        draft,
                        build * jitter(),
                        machine_verify(kind, rows, size, max(contexts)) * jitter(),
                        loop * jitter(),
                        builder,
                    )
                )
    prefills = [PrefillSample(n, machine_prefill(n) * jitter()) for n in (16, 64, 128, 256) * 3]
    return steps, prefills


@pytest.fixture(scope="module")
def fitted() -> MeasuredCosts:
    return fit_measured(*make_samples())


@pytest.mark.parametrize("kind", ["ar", "chain", "tree"])
def test_the_fit_predicts_passes_it_never_saw(fitted: MeasuredCosts, kind: str) -> None:
    # sizes between the measured ones, batch sizes and contexts beyond them (a chain is always
    # as long as the drafter's block: 16 here)
    for rows, size, context in [(1, 24, 150), (2, 48, 100), (3, 12, 300), (4, 100, 200)]:
        n = {"ar": 1, "chain": 16}.get(kind, size)
        got = fitted.verify_s(kind, [n] * rows, [context] * rows)
        want = machine_verify(kind, rows, n, context)
        assert got == pytest.approx(want, rel=0.04), (rows, size, context)


def test_draft_host_and_prefill_terms_recover_the_machine(fitted: MeasuredCosts) -> None:
    ctx = [100, 150, 90]
    assert fitted.draft_s("topk", ctx) == pytest.approx(machine_draft("topk", ctx), rel=0.03)
    assert fitted.draft_s("argmax", ctx) == pytest.approx(machine_draft("argmax", ctx), rel=0.03)
    for kind, control, sizes in [
        ("tree", "static", [24, 24]),
        ("tree", "decide", [24, 24]),
        ("ar", "static", [1, 1, 1]),
    ]:
        build, loop = fitted.host_s(kind, control, sizes)
        want = machine_host(kind, control, sizes)
        assert build == pytest.approx(want[0], rel=0.05)
        assert loop == pytest.approx(want[1], rel=0.05)
    assert fitted.prefill_s([100], [0]) == pytest.approx(machine_prefill(100), rel=0.03)
    # a chunk over a cached prefix: the difference of two whole prefills
    assert fitted.prefill_s([50], [100]) == pytest.approx(
        machine_prefill(150) - machine_prefill(100), rel=0.1
    )


def test_a_policy_with_its_own_builder_has_its_own_host_term(fitted: MeasuredCosts) -> None:
    build, _ = fitted.host_s("tree", "static", [61], "beam")
    assert build == pytest.approx(machine_host("tree", "static", [61], "beam")[0], rel=0.05)
    plain, _ = fitted.host_s("tree", "static", [61])
    assert plain == pytest.approx(machine_host("tree", "static", [61])[0], rel=0.05)
    # a builder never measured (eagle) is priced as best-first; a chain step ignores builders
    assert fitted.host_s("tree", "static", [61], "eagle") == (plain, _)
    assert fitted.host_s("chain", "static", [16], "beam") == fitted.host_s("chain", "static", [16])


def test_a_control_never_measured_falls_back(fitted: MeasuredCosts) -> None:
    # no "chain, repeat" samples: falls back to "chain, decide", which was measured
    assert "chain_repeat" not in fitted.host
    assert fitted.host_s("chain", "repeat", [16]) == fitted.host_s("chain", "decide", [16])
    # no "ar, repeat" either: decide
    assert fitted.host_s("ar", "repeat", [1]) == fitted.host_s("ar", "decide", [1])


def test_noise_is_the_measured_spread(fitted: MeasuredCosts) -> None:
    assert 0.01 < fitted.noise < 0.04  # the samples' jitter is σ = 0.02


def test_the_truth_file_round_trips(fitted: MeasuredCosts) -> None:
    text = measured_truth_toml(fitted, "mine", "a pretend machine", {"measured": "made up"})
    truth = truth_from_dict(tomllib.loads(text), "mine.toml")
    again = truth.measured
    assert again is not None
    assert truth.noise == pytest.approx(fitted.noise, abs=1e-6)
    for kind in ("ar", "chain", "tree"):
        for rows, n, c in [(1, 1, 50), (3, 40, 180)]:
            assert again.verify_s(kind, [n] * rows, [c] * rows) == fitted.verify_s(
                kind, [n] * rows, [c] * rows
            )
    assert again.host_s("tree", "decide", [8]) == fitted.host_s("tree", "decide", [8])
    assert again.host_s("tree", "decide", [8, 8]) == fitted.host_s("tree", "decide", [8, 8])
    assert again.prefill_s([77], [0]) == fitted.prefill_s([77], [0])
    assert again.meta == fitted.meta


def test_a_simulated_gpu_prices_every_part_from_the_measured_truth(fitted: MeasuredCosts) -> None:
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import DrafterSpec, get_model

    model = get_model("qwen3-8b")
    truth = GroundTruth(name="m", noise=0.0, measured=fitted)
    gpu = SimulatedGPU(get_profile("h100-sxm"), model, DrafterSpec.dflash_for(model), truth)
    sizes, ctx = np.array([16, 9]), np.array([120, 130])
    draft, host, verify = gpu.step_s("tree", sizes, ctx, topk=True, controller=True)
    assert draft == fitted.draft_s("topk", [120, 130])
    build, loop = fitted.host_s("tree", "decide", [16, 9])
    assert host == pytest.approx(build + loop)
    assert gpu.unobserved_s == pytest.approx(loop)
    assert verify == fitted.verify_s("tree", [16, 9], [120, 130])
    # AR steps pay their host work too (the roofline truths charge none)
    draft, host, verify = gpu.step_s("ar", np.array([1]), np.array([120]), controller="repeat")
    assert draft == 0.0
    assert host == pytest.approx(sum(fitted.host_s("ar", "repeat", [1])))
    assert verify == fitted.verify_s("ar", [1], [120])
    # a prefill chunk riding in the pass: prefilled alone, as the real loop does
    _, _, both = gpu.step_s("chain", np.array([16]), np.array([120]), False, False, [80], [0])
    alone = fitted.verify_s("chain", [16], [120]) + fitted.prefill_s([80], [0])
    assert both == pytest.approx(alone)
    assert gpu.prefill_truth([80], [0]) == fitted.prefill_s([80], [0])


def test_too_few_measurements_name_what_is_missing() -> None:
    steps, prefills = make_samples()
    no_chain = [s for s in steps if s.kind != "chain"]
    with pytest.raises(ConfigError, match="verify of chain steps"):
        fit_measured(no_chain, prefills)
    with pytest.raises(ConfigError, match="prefills"):
        fit_measured(steps, prefills[:2])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["verify"].pop("tree"), "missing: tree"),
        (lambda d: d["verify"]["ar"].update(knots=[2.0, 1.0, 4.0]), "rise strictly"),
        (
            lambda d: d["verify"]["ar"].update(pass_s=[-1.0] * len(d["verify"]["ar"]["knots"])),
            "≥ 0",
        ),
        (lambda d: d["draft"]["topk"].update(context_s="fast"), "must be a number"),
        (lambda d: d["host"]["tree_static"].update(typo=1.0), "unknown key"),
        (lambda d: d.update(extra=1), "unknown key"),
        (lambda d: d["prefill"].update(token_s=math.inf), "finite"),
    ],
)
def test_a_bad_measured_table_is_refused_by_name(
    fitted: MeasuredCosts, change: object, message: str
) -> None:
    import copy

    data = copy.deepcopy(fitted.to_dict())
    change(data)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message):
        measured_from_dict(data, "bad.toml")


def test_step_samples_are_checked() -> None:
    good = dict(
        kind="tree",
        preparation="topk",
        control="static",
        sizes=(4,),
        contexts=(10,),
        draft_s=1e-3,
        build_s=1e-4,
        verify_s=2e-3,
        other_s=1e-4,
    )
    StepSample(**good)  # type: ignore[arg-type]
    for key, value in [("kind", "beam"), ("sizes", (0,)), ("contexts", (1, 2)), ("verify_s", -1.0)]:
        with pytest.raises(ConfigError):
            StepSample(**{**good, key: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        PrefillSample(0, 1.0)
    assert StepSample.from_dict(StepSample(**good).to_dict()) == StepSample(**good)  # type: ignore[arg-type]


def test_a_curve_extends_its_last_segment() -> None:
    c = Curve((1.0, 2.0, 4.0), (1.0, 2.0, 3.0))
    assert c(3.0) == pytest.approx(2.5)
    assert c(8.0) == pytest.approx(5.0)  # beyond the last knot: the last segment's line
    assert c(0.5) == pytest.approx(0.5)


def test_stalls_are_left_out_of_the_fit_and_reported() -> None:
    steps, prefills = make_samples(seed=3)
    rng = np.random.default_rng(5)
    stalled = []
    for s in steps:
        hit = rng.random() < 0.04  # one step in 25 hit by a stall of 8× its time
        stalled.append(dataclasses.replace(s, verify_s=s.verify_s * (8.0 if hit else 1.0)))
    fitted = fit_measured(stalled, prefills)
    truth = [machine_verify(s.kind, s.rows, max(s.sizes), max(s.contexts)) for s in stalled]
    measured = [s.verify_s for s in stalled]
    # negative control: the plain mean of the measured times is far above the machine's …
    assert np.mean(np.array(measured) / np.array(truth)) > 1.2
    # … the fit is not, and it reports how much of the time the stalls took
    for rows, size in [(1, 24), (3, 12), (4, 100)]:
        got = fitted.verify_s("tree", [size] * rows, [150] * rows)
        assert got == pytest.approx(machine_verify("tree", rows, size, 150), rel=0.05)
    assert 0.1 < fitted.meta["stall_share"] < 0.35
    assert fit_measured(*make_samples(seed=3)).meta["stall_share"] < 0.01


def test_the_verifiers_stages_get_terms_of_their_own() -> None:
    steps, prefills = make_samples(seed=4)
    split = [
        dataclasses.replace(
            s,
            mask_s=0.1 * s.verify_s,
            forward_s=0.7 * s.verify_s,
            accept_s=0.05 * s.verify_s,
            commit_s=0.15 * s.verify_s,
        )
        for s in steps
    ]
    fitted = fit_measured(split, prefills)
    for kind in ("ar", "chain", "tree"):
        assert {f"{kind}_mask", f"{kind}_accept", f"{kind}_commit"} <= set(fitted.verify)
        n = {"ar": 1, "chain": 16}.get(kind, 40)
        got = fitted.verify_s(kind, [n] * 2, [150, 120])
        assert got == pytest.approx(machine_verify(kind, 2, n, 150), rel=0.04)
        mask = fitted.verify[f"{kind}_mask"](2, n, 150)
        assert mask / got == pytest.approx(0.1, rel=0.1)
    # unsplit samples: one term per kind, the whole call
    assert set(fit_measured(steps, prefills).verify) == {"ar", "chain", "tree"}
    with pytest.raises(ConfigError, match="add up"):
        dataclasses.replace(steps[0], mask_s=1.0, forward_s=1.0)


def test_a_scaled_truth_is_the_same_machine_slower(fitted: MeasuredCosts) -> None:
    slow = fitted.scaled(1.25)
    for kind, n in [("ar", 1), ("chain", 16), ("tree", 40)]:
        assert slow.verify_s(kind, [n] * 3, [90, 120, 150]) == pytest.approx(
            1.25 * fitted.verify_s(kind, [n] * 3, [90, 120, 150])
        )
    assert slow.draft_s("topk", [100, 140]) == pytest.approx(
        1.25 * fitted.draft_s("topk", [100, 140])
    )
    for sizes in ([9], [9, 9]):
        assert sum(slow.host_s("tree", "decide", sizes)) == pytest.approx(
            1.25 * sum(fitted.host_s("tree", "decide", sizes))
        )
    assert slow.prefill_s([64], [0]) == pytest.approx(1.25 * fitted.prefill_s([64], [0]))
    sample = make_samples()[0][-1]
    assert slow.step_s(sample) == pytest.approx(1.25 * fitted.step_s(sample))
    for bad in (0.0, -1.0, math.inf, True, "2"):
        with pytest.raises(ConfigError, match="speed factor"):
            fitted.scaled(bad)  # type: ignore[arg-type]


def _with_intake(steps: list[StepSample], seed: int, mean: float) -> list[StepSample]:
    """The samples of a machine whose drafter also pays 60 µs per target feature it takes
    before its pass; each drafted step takes 1–2·``mean`` − 1 features per request (the tokens
    its requests committed since they last drafted)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in steps:
        if s.kind == "ar":
            out.append(s)
            continue
        fed = int(rng.integers(1, int(2 * mean), s.rows).sum())
        out.append(dataclasses.replace(s, draft_s=s.draft_s + 6e-5 * fed, appended=fed))
    return out


def test_the_drafters_intake_is_a_term_of_its_own() -> None:
    """Calibration steps accepted less well than the steps predicted (fewer committed tokens a
    step, so fewer target features for the drafter to take): with the intake recorded the fit
    prices a better-accepted step right; without it, its mean intake stays baked in."""
    steps, prefills = make_samples()
    calibration = _with_intake(steps, 1, mean=2.0)
    fitted = fit_measured(calibration, prefills)
    term = fitted.draft["topk"]
    assert term.append_s == pytest.approx(6e-5, rel=0.1)
    assert 1.8 < term.appended < 2.2  # the mean per request over the samples (1 … 3)
    ctx = [100, 150, 90]
    want = machine_draft("topk", ctx) + 6e-5 * 15  # three requests taking 5 features each
    assert fitted.draft_s("topk", ctx, 15) == pytest.approx(want, rel=0.03)
    # unrecorded intake (0): the fit knows only the calibration's mean intake, and a step
    # accepted better than the calibration's is under-priced (the negative control)
    blind = fit_measured([dataclasses.replace(s, appended=0) for s in calibration], prefills).draft[
        "topk"
    ]
    assert blind.append_s == 0.0
    assert blind(3, float(sum(ctx))) < 0.95 * want
    # a step whose intake is not known is priced at the fitted mean
    assert fitted.draft_s("topk", ctx) == pytest.approx(term(3, float(sum(ctx)), 3 * term.appended))


def test_the_drafters_intake_round_trips_and_is_checked() -> None:
    steps, prefills = make_samples()
    fitted = fit_measured(_with_intake(steps, 2, mean=3.0), prefills)
    text = measured_truth_toml(fitted, "fed", "a pretend machine", {"measured": "made up"})
    again = truth_from_dict(tomllib.loads(text), "fed.toml").measured
    assert again is not None
    assert again.draft == fitted.draft
    assert fitted.scaled(2.0).draft_s("topk", [100], 7) == pytest.approx(
        2.0 * fitted.draft_s("topk", [100], 7)
    )
    table = fitted.to_dict()
    table["draft"]["topk"]["append_s"] = -1.0
    with pytest.raises(ConfigError, match="append_s"):
        measured_from_dict(table)
    table["draft"]["topk"]["append_s"] = 1e-5
    table["draft"]["topk"]["appended"] = "many"
    with pytest.raises(ConfigError, match="appended"):
        measured_from_dict(table)
    with pytest.raises(ConfigError, match="appended"):
        dataclasses.replace(steps[0], appended=-1)
    with pytest.raises(ConfigError, match="appended"):
        dataclasses.replace(steps[0], appended=True)
    # a truth file of before the term reads as one without it
    del table["draft"]["topk"]["append_s"], table["draft"]["topk"]["appended"]
    assert measured_from_dict(table).draft["topk"].append_s == 0.0


def test_a_batched_decision_pays_its_jump_once(fitted: MeasuredCosts) -> None:
    """A controller's decision over several requests takes a path a single request's does not
    (the joint budget): a jump at R = 2, flat beyond. The host term carries it as batched_s."""
    from bastion.sim.measured_fit import _fit_affine

    term = fitted.host["tree_decide"]
    assert term.batched_s == pytest.approx(BATCHED_DECISION_S, rel=0.1)
    assert fitted.host["tree_static"].batched_s < 0.1 * BATCHED_DECISION_S  # no jump there
    for rows in (1, 2, 3, 4):
        build, _ = fitted.host_s("tree", "decide", [24] * rows)
        want = machine_host("tree", "decide", [24] * rows)[0]
        assert build == pytest.approx(want, rel=0.05), rows
    # the negative control: the same samples under the form without the jump (a slope in R)
    # misprice the small batches — what the twin saw for bastion:paper at B = 4
    steps = [s for s in make_samples()[0] if s.kind == "tree" and s.control == "decide"]
    x = np.array([[1.0, s.rows, sum(s.sizes)] for s in steps])
    y = np.array([s.build_s for s in steps])
    step, request, node = _fit_affine(x, y).tolist()
    linear = step + 2 * request + 48 * node
    assert abs(linear / machine_host("tree", "decide", [24, 24])[0] - 1) > 0.15


def test_a_host_term_written_before_the_jump_reads_without_one() -> None:
    from bastion.sim.measured import HostTerm

    old = HostTerm.from_dict({"step_s": 1e-4, "request_s": 2e-5, "node_s": 0.0}, "host.x")
    assert old.batched_s == 0.0 and old(3, 10) == pytest.approx(1e-4 + 6e-5)
    keys = {"step_s": 1e-4, "request_s": 0.0, "node_s": 0.0}
    new = HostTerm.from_dict({**keys, "batched_s": 5e-4}, "host.x")
    assert new(1, 10) == pytest.approx(1e-4) and new(2, 10) == pytest.approx(6e-4)
    with pytest.raises(ConfigError, match="batched_s"):
        HostTerm.from_dict({**keys, "batched_s": -1.0}, "host.x")


@pytest.mark.parametrize(
    "knots", [np.array(2**63, dtype=np.uint64), np.array(3.0), 4.0, "1,2", None]
)
def test_a_curve_of_no_sequence_is_refused(knots: object) -> None:
    """The fuzzer found a 0-d array (iterable by attribute, not in fact) raising TypeError."""
    with pytest.raises(ConfigError, match="knots must be a list of numbers"):
        Curve(knots=knots, values=(1.0,))  # type: ignore[arg-type]
