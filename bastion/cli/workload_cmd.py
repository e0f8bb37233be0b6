"""``bastion workload``: list and show workloads, and fit one to recorded dense traces.

``bastion workload fit TRACE... --out FILE`` turns dense traces recorded by the real backend
(``bastion generate --record-trace PATH --dense-trace``, T = 0) into a workload file that
``bastion simulate --workload FILE`` draws any number of synthetic requests from
(docs/workloads.md describes the model, the fit and its validation on the demo pair).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError


def register(subparsers: Any) -> None:
    wl = subparsers.add_parser("workload", help="synthetic workloads: list, show, fit to traces")
    sub = wl.add_subparsers(dest="workload_command", metavar="ACTION", required=True)

    p = sub.add_parser("list", help="names (and aliases) of the known workloads")
    p.set_defaults(func=_list)

    p = sub.add_parser("show", help="one workload's parameters and what it was fitted to")
    p.add_argument("name", help="workload name, alias, or path to a .toml file")
    p.set_defaults(func=_show)

    p = sub.add_parser("fit", help="fit a workload file to dense traces (T = 0)")
    p.add_argument("traces", nargs="+", type=Path, help="trace files (.json) or directories")
    p.add_argument("--out", type=Path, required=True, help="workload file to write (.toml)")
    p.add_argument("--name", help="the workload's name (default: the --out file's stem)")
    p.add_argument(
        "--requests", type=int, default=256, help="synthetic requests per refinement evaluation"
    )
    p.add_argument("--no-refine", action="store_true", help="moments only, no τ(N) refinement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the fit report as JSON")
    p.set_defaults(func=_fit)


def _list(args: argparse.Namespace) -> int:
    from bastion.sim.workloads import known_workloads, workload_dirs

    index = known_workloads()
    for name, wf in sorted(index.items()):
        alias = f" (alias of {wf.workload.name})" if name != wf.workload.name else ""
        print(f"{name:28s} {wf.workload.description}{alias}")
    if args.verbose:
        print("searched: " + ", ".join(str(d) for d in workload_dirs()))
    return 0


def _show(args: argparse.Namespace) -> int:
    from bastion.sim.workloads import (
        get_workload,
        known_workloads,
        read_workload_file,
        workload_to_toml,
    )

    text = str(args.name)
    if text.endswith(".toml") or "/" in text:
        wf = read_workload_file(text)
        print(workload_to_toml(wf.workload, wf.aliases, wf.fit), end="")
        return 0
    get_workload(text)  # raises with the known names
    wf = known_workloads()[text]
    print(f"# {wf.path}")
    print(workload_to_toml(wf.workload, wf.aliases, wf.fit), end="")
    return 0


def _fit(args: argparse.Namespace) -> int:
    from bastion.sim.replay import load_traces
    from bastion.sim.workload_fit import fit_traces
    from bastion.sim.workloads import write_workload

    if args.out.suffix != ".toml":
        raise ConfigError(f"--out must name a .toml file; got {args.out}")
    if args.requests < 16:
        raise ConfigError(f"--requests must be ≥ 16; got {args.requests}")
    traces = [t for path in args.traces for t, _ in load_traces(path)]
    name = args.name or args.out.stem
    workload, report = fit_traces(
        traces, name=name, requests=args.requests, seed=args.seed, refine=not args.no_refine
    )
    fit = {
        "source": f"{len(traces)} dense trace(s): " + ", ".join(str(p) for p in args.traces),
        "command": "bastion workload fit",
        **{k: v for k, v in report.items() if k != "traces"},
    }
    write_workload(args.out, workload, (), fit)
    if args.json:
        print(json.dumps({"out": str(args.out), **report}, indent=2))
    else:
        print(f"wrote {args.out}: {name}, fitted to {len(traces)} trace(s)")
        print("N         " + " ".join(f"{s:>7s}" for s in report["sizes"]))  # type: ignore[attr-defined]
        for key in ("replayed_tau", "fitted_tau"):
            row = report[key]
            print(f"{key:10s}" + " ".join(f"{v:7.3f}" for v in row))  # type: ignore[attr-defined]
    return 0
