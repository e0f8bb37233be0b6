"""``bastion hw``: list, show and probe hardware profiles."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bastion.cost.hardware import (
    HardwareProfile,
    get_profile,
    known_profiles,
    profile_dirs,
    profile_to_toml,
)
from bastion.errors import ConfigError
from bastion.files import check_output_file, write_text_atomic


def register(subparsers: Any) -> None:
    hw = subparsers.add_parser("hw", help="hardware profiles: list, show, probe this machine")
    sub = hw.add_subparsers(dest="hw_command", metavar="ACTION", required=True)

    p = sub.add_parser("list", help="names of the known profiles")
    p.set_defaults(func=_list)

    p = sub.add_parser("show", help="one profile's numbers and sources")
    p.add_argument("name", help="profile name or path to a .toml file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_show)

    p = sub.add_parser("probe", help="measure this machine (numpy) and write a profile")
    p.add_argument("--name", default="this-machine", help="profile name (default: this-machine)")
    p.add_argument("--out", dest="output", type=Path, help="file to write (default: ./NAME.toml)")
    p.add_argument("--output", dest="output", type=Path, help=argparse.SUPPRESS)  # earlier name
    p.add_argument("--quick", action="store_true", help="small sizes: fast, less accurate")
    p.set_defaults(func=_probe)


def _list(args: argparse.Namespace) -> int:
    for name in known_profiles():
        prof = get_profile(name)
        print(f"{name:32s} {prof.description}")
    if args.verbose:
        print("searched: " + ", ".join(str(d) for d in profile_dirs()))
    return 0


def _show(args: argparse.Namespace) -> int:
    prof = get_profile(args.name)
    if args.json:
        print(json.dumps(prof.to_dict(), indent=2))
        return 0
    fp8 = f"{prof.fp8_flops / 1e12:.1f} TFLOP/s" if prof.fp8_flops else "-"
    rows = [
        ("name", prof.name),
        ("description", prof.description),
        ("BF16/FP16 dense", f"{prof.bf16_flops / 1e12:.1f} TFLOP/s"),
        ("FP8 dense", fp8),
        ("memory bandwidth", f"{prof.memory_bandwidth / 1e9:.0f} GB/s"),
        ("memory", f"{prof.memory_bytes / 1e9:.0f} GB"),
        ("L2", f"{prof.l2_bytes / 1e6:.0f} MB"),
        ("SMs", str(prof.sm_count)),
        ("efficiency (compute, memory)", f"{prof.compute_efficiency}, {prof.memory_efficiency}"),
        ("launch overhead", f"{prof.launch_overhead_s * 1e6:.2f} µs"),
        ("interconnect", _link(prof)),
        ("file", prof.path or "-"),
    ]
    for key, value in rows:
        print(f"{key:30s} {value}")
    print("sources:")
    for key, src in prof.sources.items():
        print(f"  {key}: {src}")
    return 0


def _link(prof: HardwareProfile) -> str:
    link = prof.interconnect
    if link is None:
        return "- (not given: --tp 1 only)"
    if link.kind == "none":
        return "none (one device)"
    return (
        f"{link.kind}, {link.bandwidth / 1e9:g} GB/s per GPU each way, "
        f"{link.latency_s * 1e6:g} µs per ring step, up to {link.max_gpus} GPUs"
    )


def _probe(args: argparse.Namespace) -> int:
    from bastion.cost.probe import probe_profile

    if not args.name or not args.name.strip() or "/" in args.name or args.name in (".", ".."):
        raise ConfigError(f"--name must be a profile name without '/'; got {args.name!r}")
    out: Path = args.output or Path(f"{args.name}.toml")
    check_output_file(out, "--out")  # before the measurement, not after it
    prof = probe_profile(args.name, quick=args.quick)
    write_text_atomic(out, profile_to_toml(prof))
    print(
        f"wrote {out}: {prof.bf16_flops / 1e9:.1f} GFLOP/s, "
        f"{prof.memory_bandwidth / 1e9:.1f} GB/s, launch {prof.launch_overhead_s * 1e6:.2f} µs"
    )
    return 0
