"""``bastion twin`` and ``bastion truth measure``: the simulator checked against real runs.

``bastion twin`` decodes held-out prompts for real with every policy at every batch size (in
lockstep), times this machine on calibration prompts in the same lockstep (or takes ``--truth
FILE``), replays exactly the requests that ran in the simulator under that measured truth, and
prints measured beside simulated — TPOT, speedup over AR, τ, mean tree size, the cycle's parts
and the learning controller's decision mix — with the error of each, and beside them what the
simulator predicts without measuring (the probed profile under the bare roofline). Defaults: the
shipped demo pair and its held-out prompts, on the CPU.

``bastion truth measure`` is the timing alone: it writes the measured truth as a truth file that
``bastion simulate --truth FILE`` reads unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bastion.cli import _checks as checks
from bastion.cli.demo_cmd import _batch_sizes, _need_torch, _say
from bastion.errors import BudgetError, ConfigError
from bastion.paths import check_output_dir
from bastion.records import json_safe


def _prompts(path: str | None, default: Path, what: str) -> list[str]:
    from bastion.files import read_json_file

    p = Path(path) if path else default
    data = read_json_file(p, what)  # missing, unreadable, not JSON: ConfigError
    if not isinstance(data, list) or not data or not all(isinstance(t, str) and t for t in data):
        raise ConfigError(f"{p}: {what} must be a JSON list of non-empty strings")
    return data


def _policies(groups: list[str]) -> tuple[str, ...]:
    from bastion.backends.torch.twin import TWIN_POLICIES
    from bastion.policies import policy_labels, split_policy_specs

    chosen = tuple(p for g in groups for p in split_policy_specs(g))
    if groups and not chosen:
        raise BudgetError(f"--policy lists no policy ({groups!r}); e.g. ar,chain,bastion")
    chosen = chosen or TWIN_POLICIES
    if chosen[0] != "ar":
        chosen = ("ar", *[p for p in chosen if p != "ar"])
    policy_labels(chosen)  # unknown, malformed or repeated: refused here, before any loading
    return chosen


def _load(args: argparse.Namespace) -> tuple[Any, Any, Path, Any]:
    """(target, tokenizer, drafter directory, hardware profile) for ``--device``."""
    import torch
    from transformers import AutoTokenizer

    from bastion.backends.torch import load_target
    from bastion.backends.torch.calibrate import device_profile
    from bastion.cost.calibration import CalibrationCache
    from bastion.demo import get_pair

    pair = get_pair(args.pair)
    target_dir = Path(args.target) if args.target else pair.target
    drafter_dir = Path(args.drafter) if args.drafter else pair.drafter
    for d, flag in ((target_dir, "--target"), (drafter_dir, "--drafter")):
        if not (d / "config.json").is_file():
            raise ConfigError(f"{flag} {d}: no config.json (a model directory)")
    if args.device.startswith("cuda") and not args.gpu:
        raise ConfigError("--device cuda needs --gpu NAME, the GPU's profile (`bastion hw list`)")
    dtype = getattr(torch, args.dtype) if args.dtype else None  # None: the device's default
    target = load_target(target_dir, args.device, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    hardware = device_profile(torch.device(args.device), args.gpu, CalibrationCache())
    return target, tokenizer, drafter_dir, hardware


def _beliefs(target: Any, drafter_dir: Path, policies: tuple[str, ...], say: Any) -> dict[str, Any]:
    """Each cost-model policy's belief, calibrated on this device as the demo does."""
    from bastion.backends.torch import DFlashDrafter
    from bastion.demo.run import calibrated_beliefs
    from bastion.policies import make_policy

    if not any(p.startswith("bastion") for p in policies):
        return {}
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
    model, learned, _ = calibrated_beliefs(target, drafter, policies, True, say)
    learns = {p: bool(getattr(make_policy(p), "learns", False)) for p in policies}
    return {p: learned if learns[p] else model for p in policies if p.startswith("bastion")}


def run_twin_cmd(args: argparse.Namespace) -> int:
    sizes = _batch_sizes(args.batch_size) if args.batch_size else (1, 4)
    checks.int_in("--max-new-tokens", args.max_new_tokens, 2, 1 << 16)
    checks.int_in("--repeats", args.repeats, 1, 100)
    checks.int_in("--warmup", args.warmup, 0, 100)
    policies = _policies(args.policy)
    if args.out:
        check_output_dir(args.out, "--out")
    truth = None
    if args.truth:
        from bastion.sim.truth import get_truth

        truth = get_truth(args.truth)  # a bad file fails here, before anything runs
    _need_torch()
    from bastion.backends.torch.twin import run_twin
    from bastion.demo import CALIBRATION_PROMPTS_FILE, PROMPTS_FILE
    from bastion.sim.twin import format_comparison

    texts = _prompts(args.prompts, PROMPTS_FILE, "--prompts")
    calibration = _prompts(
        args.calibration_prompts, CALIBRATION_PROMPTS_FILE, "calibration prompts"
    )
    from bastion.backends.torch.twin import CALIBRATION_PROMPTS

    # the shipped file: its first few (each decoded as long as a predicted prompt); yours: all
    limit = len(calibration) if args.calibration_prompts else CALIBRATION_PROMPTS
    overlap = set(texts) & set(calibration)
    if overlap and truth is None:
        raise ConfigError(
            f"{len(overlap)} prompt(s) are both predicted and used to time the machine; the "
            "calibration prompts must be disjoint from --prompts (--calibration-prompts FILE)"
        )
    show = args.progress if args.progress is not None else (sys.stderr.isatty() and not args.json)
    say = _say(show)
    target, tokenizer, drafter_dir, hardware = _load(args)
    beliefs = _beliefs(target, drafter_dir, policies, say)
    result = run_twin(
        target,
        drafter_dir,
        [list(tokenizer(t)["input_ids"]) for t in texts],
        [list(tokenizer(t)["input_ids"]) for t in calibration[:limit]],
        policies=policies,
        batch_sizes=sizes,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        truth=truth,
        beliefs=beliefs,
        hardware=hardware,
        unmeasured=_unmeasured(target, args.device),
        progress=say,
    )
    precision = str(next(target.parameters()).dtype).removeprefix("torch.")
    table = format_comparison(result.entries)
    if args.out:
        _write_out(Path(args.out), result, table, precision)
    if args.json:
        print(json.dumps({**json_safe(result.to_json()), "dtype": precision}, indent=2))
    else:
        _print(result, table, len(texts), args, precision)
    # below float32 a pass's sums depend on its shape, so near-ties may decode differently in a
    # tree's pass than in AR's: a difference there is the precision's, not a lossless violation
    return 0 if result.identical or precision != "float32" else 1


def _unmeasured(target: Any, device: str) -> dict[str, Any]:
    """What the simulator predicts without timing this machine: the bare roofline of the
    device's profile in the device's form (on a CPU host and device work add, and there are no
    GEMM tiles), with the target's own element width; and the default truth as shipped."""
    from bastion.sim.ground_truth import GroundTruth
    from bastion.sim.truth import DEFAULT_TRUTH, get_truth

    width = float(next(target.parameters()).element_size())
    cpu = device == "cpu"
    bare = GroundTruth(
        name="roofline",
        host_adds=cpu,
        weight_bytes=width,
        activation_bytes=width,
        tile_tokens=0 if cpu else GroundTruth.tile_tokens,
    )
    return {"roofline": bare, DEFAULT_TRUTH: get_truth(DEFAULT_TRUTH)}


def _print(result: Any, table: str, n: int, args: argparse.Namespace, precision: str) -> None:
    how = "measured in the same lockstep" if not args.truth else f"from {args.truth}"
    print(
        f"{n} prompts × {args.max_new_tokens} new tokens on {args.device} in {precision}, T = 0; "
        "real → simulated "
        f"(error); truth {how}; TPOT: the median over requests"
    )
    print(table)
    for source, s in result.summary.items():
        gap = s["mix_gap_max"] * 100  # NaN: no learning controller ran
        mix = "—" if gap != gap else f"{gap:.0f} point{'' if round(gap) == 1 else 's'}"
        print(
            f"{source}: speedup over AR off by {s['speedup_error_mean'] * 100:.1f} % on average, "
            f"{s['speedup_error_max'] * 100:.1f} % at worst; TPOT off by "
            f"{s['tpot_error_mean'] * 100:.1f} % on average, {s['tpot_error_max'] * 100:.1f} % at "
            f"worst; decision mix within {mix}; ranking: "
            f"{int(s['ranking_flips'])} of {int(s['ranked_pairs'])} pairs flipped"
        )
    if result.speeds:
        speeds = "; ".join(
            f"B = {b}: " + ", ".join(f"{x:.3f}" for x in v) for b, v in result.speeds.items()
        )
        print(
            "the machine's speed in each run (its time ÷ the truth's, read from the calibration "
            f"steps around each step; the replay follows it step by step): {speeds}"
        )
    exact = [e for e in result.entries if e["source"] == "sim" and e["policy"] != "ar"]
    fixed = [e for e in exact if not e["policy"].startswith("bastion")]
    same = sum(e["committed_exact"] for e in fixed)
    print(f"fixed-size policies replayed step-exactly: {same} of {len(fixed)}")
    if result.identical:
        verdict = "identical"
    elif precision != "float32":
        verdict = (
            f"different on some prompts — expected in {precision}, whose sums depend on the "
            "pass's shape (AR's own output changes with the batch size); float32 is the "
            "lossless check"
        )
    else:
        verdict = "DIFFERENT — losslessness violated"
    print(f"outputs of all policies vs AR: {verdict}")
    _busy(result.truth.measured)
    parts = ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in result.seconds.items())
    print(f"wall time: {parts}")


def _busy(measured: Any) -> None:
    """Say when the machine stalled for a noticeable share of the timing (another process)."""
    from bastion.sim.measured_fit import BUSY_STALL_SHARE

    share = float(measured.meta.get("stall_share", 0.0)) if measured is not None else 0.0
    if share > BUSY_STALL_SHARE:
        print(
            f"warning: stalls of the machine took {share * 100:.0f} % of the timed verify passes "
            "(another process?); the measured times, and the errors against them, are the busy "
            "machine's: rerun on a quiet one",
            file=sys.stderr,
        )


def _write_out(out: Path, result: Any, table: str, precision: str) -> None:
    from bastion.files import write_json_atomic, write_text_atomic
    from bastion.sim.twin import plot_twin
    from bastion.trace import write_trace

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "twin.json", {**json_safe(result.to_json()), "dtype": precision})
    write_text_atomic(out / "comparison.txt", table + "\n")
    if result.truth.measured is not None:
        write_text_atomic(out / "truth.toml", _truth_toml(result.truth.measured))
    for i, trace in enumerate(result.traces):
        write_trace(out / "traces" / f"request-{i}.json", trace)
    steps = {
        "calibration": [s.to_dict() for s in result.samples],
        "prefills": [[p.tokens, p.seconds] for p in result.prefills],
        "real": {f"{p}@{b}": [s.to_dict() for s in v] for (p, b), v in result.real_samples.items()},
    }
    write_json_atomic(out / "steps.json", steps)
    try:
        plot_twin(result.rows, out / "twin-tpot.png")
    except ConfigError as exc:  # no matplotlib: the numbers are written, the plot is not
        print(f"  (no plot: {exc})", file=sys.stderr)


def _truth_toml(measured: Any) -> str:
    from bastion.sim.measured_file import measured_truth_toml

    return measured_truth_toml(
        measured,
        "measured",
        "this machine, timed by bastion (measured truth: every cost fitted from real steps)",
        {
            "measured": "fitted by bastion.sim.measured_fit.fit_measured from real steps of the "
            "calibration policies on calibration prompts disjoint from the predicted ones"
        },
    )


def run_truth_measure(args: argparse.Namespace) -> int:
    sizes = _batch_sizes(args.batch_size) if args.batch_size else (1, 4)
    checks.int_in("--repeats", args.repeats, 1, 100)
    from bastion.files import write_text_atomic
    from bastion.paths import check_output_file

    check_output_file(args.out, "--out")
    _need_torch()
    from bastion.backends.torch.twin import CALIBRATION_POLICIES, measure_truth
    from bastion.demo import CALIBRATION_PROMPTS_FILE

    texts = _prompts(args.prompts, CALIBRATION_PROMPTS_FILE, "--prompts")
    if not args.prompts:
        from bastion.backends.torch.twin import CALIBRATION_PROMPTS

        texts = texts[:CALIBRATION_PROMPTS]
    say = _say(args.progress if args.progress is not None else sys.stderr.isatty())
    target, tokenizer, drafter_dir, _ = _load(args)
    beliefs = _beliefs(target, drafter_dir, CALIBRATION_POLICIES, say)
    measured = measure_truth(
        target,
        drafter_dir,
        [list(tokenizer(t)["input_ids"]) for t in texts],
        batch_sizes=sizes,
        repeats=args.repeats,
        beliefs=beliefs,
        progress=say,
    )
    write_text_atomic(args.out, _truth_toml(measured))
    _busy(measured)
    print(
        f"wrote {args.out}: {measured.meta.get('steps')} steps and {measured.meta.get('prefills')} "
        f"prefills fitted in {measured.meta.get('seconds')} s; noise σ {measured.noise:.3f}; "
        f"stalls {measured.meta.get('stall_share', 0.0) * 100:.1f} % of the verify time"
    )
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pair",
        choices=("small", "base"),
        default="small",
        help="the shipped pair whose models are used where --target/--drafter are not given "
        "(default: small)",
    )
    p.add_argument("--target", metavar="DIR", help="target model directory (default: the pair's)")
    p.add_argument(
        "--drafter", metavar="DIR", help="DFlash drafter directory (default: the pair's)"
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="the models' precision (default: float32 on a CPU, bfloat16 on CUDA); bfloat16 is "
        "not batch-invariant, so outputs may differ from AR's there (reported, not a failure)",
    )
    p.add_argument("--gpu", metavar="NAME", help="the GPU's hardware profile (with --device cuda)")
    p.add_argument(
        "--batch-size", action="append", default=[], help="batch sizes, e.g. 1,4 (default: 1,4)"
    )
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "twin",
        help="check the simulator against real runs on this machine (needs bastion[torch])",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument("--prompts", metavar="FILE", help="JSON list of prompts to predict")
    p.add_argument(
        "--calibration-prompts", metavar="FILE", help="JSON list of prompts to time the machine on"
    )
    p.add_argument("--policy", action="append", default=[], help="default: every built-in")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per policy (lockstep)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs per policy")
    p.add_argument("--truth", metavar="FILE", help="a truth instead of timing this machine")
    p.add_argument("--json", action="store_true", help="one record per policy, batch and source")
    p.add_argument("--out", metavar="DIR", help="write twin.json, truth.toml, traces, a plot")
    p.set_defaults(func=run_twin_cmd)

    t = sub.add_parser("truth", help="truth files of the simulated device")
    ts = t.add_subparsers(dest="truth_command", required=True)
    m = ts.add_parser(
        "measure",
        help="time this machine's costs and write them as a truth file",
        description="Time this machine's real costs on calibration prompts (every step kind, "
        "tree sizes 2 … 128, both controllers, each prefill length) and write them as a truth "
        "file for `bastion simulate --truth FILE`.",
    )
    _common(m)
    m.add_argument("--prompts", metavar="FILE", help="JSON list of calibration prompts")
    m.add_argument("--repeats", type=int, default=2, help="timed runs per calibration policy")
    m.add_argument("--out", metavar="FILE.toml", required=True, help="the truth file to write")
    m.set_defaults(func=run_truth_measure)
