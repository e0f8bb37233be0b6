"""``bastion simulate`` and ``bastion experiment``: the simulator from the command line.

``bastion simulate`` with no arguments compares target-only AR, the DFlash chain, a fixed
best-first tree and Bastion's adaptive controller on qwen3-8b × h100-sxm with the ``math``
workload, and prints one row per policy (speedup over AR, τ, mean tree size, TPOT, throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bastion.cli import _checks as checks
from bastion.errors import BudgetError, ConfigError

DEFAULT_PREFILL_CHUNK = (
    512  # bastion.sim.prefill.DEFAULT_PREFILL_CHUNK (the CLI does not import bastion.sim eagerly)
)


def _progress(enabled: bool):  # type: ignore[no-untyped-def]
    """A progress bar per policy on stderr, with rate and ETA (tqdm)."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm  # type: ignore[import-untyped]

    bars: dict[str, Any] = {}

    def report(policy: str, done: int, total: int) -> None:
        bar = bars.get(policy)
        if bar is None:
            for other in bars.values():
                other.close()
            bar = bars[policy] = tqdm(
                total=total, desc=f"{policy:<12}", unit="req", file=sys.stderr, leave=False
            )
        bar.update(done - bar.n)

    def close() -> None:
        for bar in bars.values():
            bar.close()

    return report, close


def check_output_dir(path: Path) -> None:
    """Refuse an output directory that cannot be created or written, before any work."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--out {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {path}: {probe} is not writable")


DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # bastion.sim.memory's (not imported eagerly)


def memory_share(text: str) -> float | None:
    """``--gpu-memory-utilization``: a number in (0, 1], or ``off`` (None: memory not
    limited)."""
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        raise BudgetError(
            f"--gpu-memory-utilization must be a number in (0, 1] or off; got {text!r}"
        ) from None
    checks.float_in("--gpu-memory-utilization", value, 0.0, 1.0, open_low=True)
    return value


def run_simulate(args: argparse.Namespace) -> int:
    from bastion.sim.simulate import DEFAULT_POLICIES, SimSpec, simulate

    if args.concurrency is None:
        open_loop = args.arrival_rate is not None or args.arrivals is not None
        args.concurrency = 64 if open_loop else 1

    from bastion.policies import split_policy_specs

    policies = tuple(p for group in args.policy for p in split_policy_specs(group))
    if args.policy and not policies:
        raise BudgetError(
            f"--policy {','.join(args.policy)!r} names no policy; "
            "give specs such as chain,fixed:64,bastion"
        )
    utilization = memory_share(args.gpu_memory_utilization)
    checks.float_in("--slo-ttft", args.slo_ttft, 0.0, open_low=True)
    checks.float_in("--slo-tpot", args.slo_tpot, 0.0, open_low=True)
    spec = SimSpec(
        model=args.model,
        gpu=args.gpu,
        workload=args.trace or args.workload,
        policies=policies or DEFAULT_POLICIES,
        temperature=args.temperature,
        concurrency=args.concurrency,
        requests=args.requests,
        arrival_rate=args.arrival_rate,
        arrivals=args.arrivals,
        prefill_chunk=args.prefill_chunk,
        seed=args.seed,
        output_len=args.output_len,
        prompt_len=args.prompt_len,
        cost_mode=args.cost_mode,
        n_max=args.n_max,
        truth=args.truth,
        warmup_steps=args.warmup_steps,
        drafter_config=args.drafter_config,
        calibration_file=args.calibration,
        gpu_memory_utilization=utilization,
        slo_ttft_s=args.slo_ttft,
        slo_tpot_s=args.slo_tpot,
        tp=args.tp,
    )
    show = args.progress if args.progress is not None else (sys.stderr.isatty() and not args.json)
    out = Path(args.out) if args.out else None
    if out is not None:
        check_output_dir(out)  # before the work, not after it
    report, close = _progress(show)
    try:
        result = simulate(spec, progress=report)
    finally:
        close()
    from bastion.records import json_safe as _json_safe
    from bastion.sim.experiments import records_of
    from bastion.sim.results import write_csv_atomic, write_records_json

    rows, requests = records_of(result, {"spec": spec.to_dict()})
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_csv_atomic(out / "simulate.csv", rows)
        write_records_json(out / "simulate.json", rows, spec=spec.to_dict())
        write_csv_atomic(out / "requests.csv", requests)
    if args.json:
        print(json.dumps(_json_safe({"spec": spec.to_dict(), "records": rows}), indent=2))
        return 0
    gpus = spec.gpu if spec.tp == 1 else f"{spec.tp} × {spec.gpu} (tensor parallelism)"
    print(
        f"{spec.model} on {gpus}, workload {spec.workload}, T = {spec.temperature:g}, "
        f"concurrency {spec.concurrency}, {spec.requests} requests, seed {spec.seed}, "
        f"truth {spec.truth}"
    )
    drafter = spec.drafter()
    print(
        f"drafter: {spec.drafter_config or 'the DFlash layout for the target'} "
        f"({drafter.model.layers} layers, block {drafter.block_size}, {drafter.taps} taps)"
    )
    where = (
        f"from the calibration record {spec.calibration_file}, its fit"
        if spec.calibration_file
        else "calibrated on the simulated GPU"
    )
    print(
        f"controller's cost model: {spec.cost_mode}, {where} "
        f"(RMSE {result.calibration_rmse_bare_s * 1e3:.2f} ms bare → "
        f"{result.calibration_rmse_calibrated_s * 1e3:.2f} ms)"
    )
    print(f"{'policy':<12} {'speedup':>8} {'τ':>6} {'mean N':>7} {'TPOT ms':>8} {'tok/s':>8}")
    for r in result.rows:
        print(
            f"{r.policy:<12} {r.speedup:>7.2f}× {r.tau:>6.2f} {r.mean_tree_size:>7.1f} "
            f"{r.tpot_s * 1e3:>8.3f} {r.throughput_tok_s:>8.0f}"
        )
    if spec.arrival_rate is not None or spec.arrivals is not None or spec.prefill_chunk:
        print(f"{'policy':<12} {'TTFT p50':>9} {'p99':>9} {'TPOT p50':>9} {'p99':>9} (ms)")
        for r in result.rows:
            print(
                f"{r.policy:<12} {r.ttft_p50_s * 1e3:>9.2f} {r.ttft_p99_s * 1e3:>9.2f} "
                f"{r.tpot_p50_s * 1e3:>9.3f} {r.tpot_p99_s * 1e3:>9.3f}"
            )
    plan = spec.memory_plan(drafts=True) if spec.gpu_memory_utilization is not None else None
    if plan is not None:
        print(f"memory (a drafting policy): {plan.describe()}")
        print(
            f"{'policy':<12} {'KV cap':>8} {'KV peak':>8} {'running':>8} {'preempt':>8} "
            f"{'queue p50':>10} {'p99':>9} (s)"
        )
        for r in result.rows:
            print(
                f"{r.policy:<12} {r.kv_capacity_tokens:>8} {r.kv_peak_tokens:>8} "
                f"{r.max_running:>8} {r.preemptions:>8} {r.queue_delay_p50_s:>10.3f} "
                f"{r.queue_delay_p99_s:>9.3f}"
            )
    if spec.slo_ttft_s is not None or spec.slo_tpot_s is not None:
        given = ", ".join(
            f"{name} ≤ {value * 1e3:g} ms"
            for name, value in (("TTFT", spec.slo_ttft_s), ("TPOT", spec.slo_tpot_s))
            if value is not None
        )
        print(f"SLOs: {given}")
        for r in result.rows:
            print(
                f"{r.policy:<12} attainment {r.slo_attainment:>6.1%}  goodput "
                f"{r.goodput_rps:>8.3f} requests/s"
            )
    for r in result.rows:
        if r.cycle_predicted_s == r.cycle_predicted_s:  # a learning controller's (not nan)
            print(
                f"{r.policy}: cycle predicted {r.cycle_predicted_s * 1e3:.3f} ms, simulated "
                f"{r.cycle_observed_s * 1e3:.3f} ms (mean over the steps it learned from)"
            )
    print(
        f"simulated {result.simulated_s:.1f} s in {result.wall_s:.1f} s wall "
        f"({result.simulated_s / result.wall_s:.0f}× real time)"
    )
    return 0


def run_experiment(args: argparse.Namespace) -> int:
    from bastion.sim import experiments

    if args.list:
        for name, path in experiments.known_experiments().items():
            print(f"{name:<20} {path}")
        return 0
    if (args.name is None) == (args.config is None):
        known = ", ".join(experiments.known_experiments())
        raise ConfigError(
            "give an experiment: a shipped NAME (" + known + ") or --config FILE.toml, not both"
            if args.name and args.config
            else "give an experiment: a shipped NAME (" + known + ") or --config FILE.toml"
        )
    config = experiments.resolve_config(args.config or args.name)
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be ≥ 1; got {args.workers}")
    if not 0 < args.connect_timeout < float("inf"):
        raise ConfigError(
            f"--connect-timeout must be a finite number > 0 (seconds); got {args.connect_timeout}"
        )
    if args.address and args.executor != "ray":
        raise ConfigError("--address is for --executor ray (a Ray cluster)")
    out = Path(args.out)
    if args.dry_run:
        print(experiments.plan(config, out, args.quick).describe())
        return 0
    check_output_dir(out)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    report = experiments.run_experiment(
        config,
        out,
        executor=args.executor,
        address=args.address,
        workers=args.workers,
        quick=args.quick,
        progress=show,
        connect_timeout=args.connect_timeout,
    )
    print(report)
    return 0


def _aliases(p: argparse.ArgumentParser) -> None:
    """The old or other subcommands' names of shared options, hidden (deprecated)."""
    p.add_argument("--output", dest="out", help=argparse.SUPPRESS)
    p.add_argument("--quiet", dest="progress", action="store_false", help=argparse.SUPPRESS)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare decoding policies on a simulated GPU",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="qwen3-8b", help="bundled model name or config.json")
    p.add_argument("--gpu", default="h100-sxm", help="hardware profile (see `bastion hw list`)")
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        help="policy spec(s), repeatable or comma-separated: chain, fixed:N, beam:WxD, "
        "eagle:K,D,N, bastion (default: chain,fixed:64,bastion; AR always runs)",
    )
    p.add_argument(
        "--workload",
        default="math",
        help="a workload name or alias (`bastion workload list`), a workload .toml file, or "
        "recorded traces (docs/workloads.md)",
    )
    p.add_argument("--trace", help="replay a recorded trace file or directory instead")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop: clients (C); open loop: most requests in service "
        "(default: 1 closed, 64 open)",
    )
    p.add_argument(
        "--arrival-rate",
        type=float,
        help="open loop: Poisson arrivals, requests per second (seeded by --seed)",
    )
    p.add_argument(
        "--arrivals",
        help="open loop: a file with one request per line: arrival_s prompt_len output_len",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=DEFAULT_PREFILL_CHUNK,
        help="prompt tokens prefilled per step, riding with decode (0: no prefill)",
    )
    p.add_argument("--requests", type=int, default=8, help="requests per policy")
    p.add_argument("--output-len", type=int, help="tokens per request (default: workload's)")
    p.add_argument(
        "--prompt-len",
        type=int,
        help="every request's prompt, in tokens (default: the workload's lengths)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cost-model",
        "--cost-mode",  # the earlier name
        dest="cost_mode",
        default="static",
        help="the controller's latency model: bare, static, ema, ema+calib, or "
        "profiled:[FORMAT:]FILE (a measured per-operator table, docs/cost-model.md)",
    )
    p.add_argument("--n-max", type=int, default=1024, help="the controller's N_max")
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="the controller's belief from a calibration record (the JSON file `bastion "
        "calibrate` writes and prints) instead of a sweep on the simulated GPU; it must have "
        "been fitted on --gpu's profile and for --model (else an error); with --cost-model "
        "static (the default), ema+calib or profiled:…",
    )
    p.add_argument(
        "--drafter-config",
        metavar="PATH",
        help="the drafter to price: a DFlash config.json or the checkpoint directory holding "
        "one (e.g. bastion/demo/models/drafter); it must fit --model (vocabulary, hidden size, "
        "tapped layers). Default: the published 5-layer DFlash layout at the target's widths",
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=200,
        help="decode steps the learning controller (bastion) serves on other requests before "
        "its measured run (0: measure from a cold start)",
    )
    p.add_argument(
        "--truth",
        default="hf-eager",
        help="the simulated GPU's ground truth: a truth name (hf-eager, cudagraph, builtin, or "
        "one in $BASTION_TRUTHS) or a path to a truth .toml file (docs/simulator.md)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        default=str(DEFAULT_GPU_MEMORY_UTILIZATION),
        metavar="FRACTION",
        help="the share of the GPU's memory the server takes for weights, activations and a "
        "paged KV cache (16-token blocks): requests are admitted when their blocks fit and "
        "preempted when they cannot grow; a model that does not fit is refused. A number in "
        "(0, 1] (default 0.9, vLLM's), or off (memory does not limit the run)",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor parallelism: split the model over N GPUs of --gpu (heads, FFN, vocabulary "
        "and KV cache N ways; two all-reduces per layer over the profile's [interconnect]); N "
        "must divide the attention heads, and the KV heads or be a multiple of them (default 1)",
    )
    p.add_argument(
        "--slo-ttft",
        type=float,
        metavar="S",
        help="a time-to-first-token SLO in seconds: records report slo_attainment and goodput_rps",
    )
    p.add_argument(
        "--slo-tpot",
        type=float,
        metavar="S",
        help="a time-per-output-token SLO in seconds (with --slo-ttft: a request meets both)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="also write simulate.csv, simulate.json and requests.csv to this directory",
    )
    p.add_argument(
        "--json", action="store_true", help='print {"spec", "records": [one per policy]}'
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars on stderr (default: when stderr is a terminal)",
    )
    _aliases(p)
    p.set_defaults(func=run_simulate)

    e = sub.add_parser(
        "experiment",
        help="run a grid of simulations from a config file, or one of the paper's analyses",
        description="Run (or resume) an experiment: a grid of simulations from a TOML config "
        "(docs/experiments-config.md), or a shipped one by name (--list). Writes results.csv, "
        "results.json, requests.csv, summary.md and plots to OUT/NAME/.",
    )
    e.add_argument(
        "name",
        nargs="?",
        help="a shipped experiment (budget-sweep, best-first-vs-beam, multi-batch, moe, "
        "latency-model, serving-scale, …; --list) or a config path",
    )
    e.add_argument("--config", metavar="FILE.toml", help="the experiment's config file")
    e.add_argument("--list", action="store_true", help="list the shipped experiments and exit")
    e.add_argument("--out", metavar="DIR", default="out/experiments", help="results directory")
    e.add_argument(
        "--executor",
        default="process",
        choices=("process", "serial", "ray"),
        help="where runs execute: a local process pool, this process, or Ray",
    )
    e.add_argument(
        "--address",
        help="with --executor ray: the cluster's address, HOST:PORT (the GCS address that "
        "`ray start --head` prints; the driver joins the cluster) or ray://HOST:PORT (Ray "
        "Client, port 10001). Without it a local Ray instance is started",
    )
    e.add_argument(
        "--workers",
        type=int,
        help="process/local Ray: worker processes (default: CPU count); with --address: the "
        "most runs in flight at once (default: no cap, the cluster's CPUs decide)",
    )
    e.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the Ray cluster at --address before giving up",
    )
    e.add_argument("--quick", action="store_true", help="the config's [quick] grid: small runs")
    e.add_argument(
        "--dry-run",
        action="store_true",
        help="print the grid's size and what is stored; run nothing",
    )
    e.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar with rate and ETA on stderr (default: when stderr is a terminal)",
    )
    _aliases(e)
    e.set_defaults(func=run_experiment)
