"""The simulator's side of docs/paper-claims.md, recomputed.

    python docs/make_paper_claims.py            # about 3 minutes on 2 cores
    python docs/make_paper_claims.py --quick    # fewer and shorter requests, for a smoke test

Runs, through the public Python API, the simulations behind the claims that the shipped
experiments (`bastion experiment NAME`) do not already cover, and writes every number to
docs/data/paper-claims.json (atomically). Each entry records the equivalent `bastion simulate`
command. Nothing here is fitted: the workloads were fitted beforehand (docs/workloads.md says to
which numbers) and the truth files were set from measurements and sources (docs/simulator.md);
this script only runs them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bastion.bestfirst import accepted_paths, best_first_flat
from bastion.files import write_text_atomic
from bastion.sim.simulate import SimSpec, calibrated_cost_model, simulate
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload

OUT = Path(__file__).resolve().parent / "data" / "paper-claims.json"
FIXED = (16, 32, 64, 128, 256, 512, 1024)


def command(spec: SimSpec) -> str:
    """The `bastion simulate` command line that reproduces ``spec``."""
    parts = ["bastion simulate", f"--model {spec.model}", f"--gpu {spec.gpu}"]
    parts += [f"--workload {spec.workload}", f"--truth {spec.truth}"]
    parts += ["--policy " + ",".join(str(p) for p in spec.policies)]
    parts += [f"--concurrency {spec.concurrency}", f"--requests {spec.requests}"]
    if spec.output_len is not None:
        parts.append(f"--output-len {spec.output_len}")
    return " ".join(parts)


def run(spec: SimSpec) -> dict[str, Any]:
    result = simulate(spec)
    rows = {}
    for r in result.rows:
        steps = max(r.steps, 1)
        rows[r.policy] = {
            "speedup": r.speedup,
            "tau": r.tau,
            "mean_n": r.mean_tree_size,
            "throughput": r.throughput_tok_s,
            "draft_ms_per_step": 1e3 * r.draft_s / steps,
            "prep_ms_per_step": 1e3 * r.prep_s / steps,
            "verify_ms_per_step": 1e3 * r.verify_s / steps,
            "mean_batch": r.mean_batch,
        }
    return {"command": command(spec), "rows": rows}


def headline(size: dict[str, Any]) -> dict[str, Any]:
    """Fig. 1 / Table 1 (A100, T = 0): the adaptive policy over AR and over the DFlash chain."""
    out = {}
    for model in ("qwen3-4b", "qwen3-8b"):
        for workload in ("math", "code", "chat"):
            spec = SimSpec(
                model=model,
                gpu="a100-sxm-80gb",
                workload=workload,
                policies=("chain", *[f"fixed:{n}" for n in FIXED[:5]], "bastion", "bastion:paper"),
                **size,
            )
            out[f"{model}/{workload}"] = run(spec)
    return out


def ddtree_sweep(size: dict[str, Any]) -> dict[str, Any]:
    """Tables 5–6 (A100 PCIe 40 GB, T = 0): the fixed-N sweep and the adaptive policy."""
    out = {}
    for model in ("qwen3-8b", "llama-3.1-8b"):
        for workload in ("math", "code", "chat"):
            spec = SimSpec(
                model=model,
                gpu="a100-pcie-40gb",
                workload=workload,
                policies=(*[f"fixed:{n}" for n in FIXED[:6]], "bastion", "bastion:paper"),
                **size,
            )
            out[f"{model}/{workload}"] = run(spec)
    return out


def batched(size: dict[str, Any]) -> dict[str, Any]:
    """Tables 2–3 (Qwen3-8B, A6000, SGLang-like CUDA-graph truth): C = 16 and C = 36."""
    out = {}
    for concurrency in (16, 36, 64):
        for workload in ("math", "code"):
            spec = SimSpec(
                model="qwen3-8b",
                gpu="rtx-a6000",
                workload=workload,
                truth="cudagraph",
                policies=("chain", "fixed:16", "fixed:32", "fixed:64", "bastion", "bastion:paper"),
                concurrency=concurrency,
                requests=max(size["requests"], 2 * concurrency),
                output_len=min(size["output_len"], 256),
            )
            out[f"C{concurrency}/{workload}"] = run(spec)
    return out


def moe(size: dict[str, Any]) -> dict[str, Any]:
    """Tables 7–8 (Qwen3-Coder-30B-A3B, A100 80 GB): fixed N = 16 … 1024, chain, adaptive."""
    spec = SimSpec(
        model="qwen3-coder-30b-a3b",
        gpu="a100-sxm-80gb",
        workload="qwen3-coder-30b-a3b-code",
        policies=("chain", *[f"fixed:{n}" for n in FIXED], "bastion", "bastion:paper"),
        **size,
    )
    return {"code": run(spec)}


def calibration() -> dict[str, Any]:
    """§5.2: the bare and calibrated roofline's RMSE against the simulated GPU (A100)."""
    from bastion.cost.hardware import get_profile
    from bastion.cost.models import DrafterSpec, get_model
    from bastion.sim.gpu import SimulatedGPU
    from bastion.sim.truth import get_truth

    out = {}
    for name in ("qwen3-8b", "llama-3.1-8b"):
        model = get_model(name)
        drafter = DrafterSpec.dflash_for(model)
        gpu = SimulatedGPU(get_profile("a100-sxm-80gb"), model, drafter, get_truth("hf-eager"))
        _, record = calibrated_cost_model(gpu, "static", 0)
        out[name] = {
            "rmse_bare_ms": 1e3 * record.rmse_bare_s,
            "rmse_calibrated_ms": 1e3 * record.rmse_calibrated_s,
        }
    return out


def proxy_correlation(steps: int) -> dict[str, Any]:
    """F.1: Pearson correlation of Â (the tree's drafter mass) with the committed length, for
    best-first trees of N = 64 on every shipped workload: per step, and per request (each
    request's means over its steps; requests differ in difficulty)."""
    out = {}
    for name in ("qwen3-8b-math", "qwen3-8b-code", "qwen3-8b-chat", "qwen3-coder-30b-a3b-code"):
        workload = get_workload(name)
        batch = 64
        source = SyntheticSource(workload, seed=0, temperature=0.0)
        source.reserve(batch)
        slots = np.arange(batch, dtype=np.int64)
        for slot in slots.tolist():
            source.admit(slot, slot)
        a_hat, accepted = [], []
        for _ in range(max(steps // batch, 1)):
            marginals, target = source.draft(slots, np.zeros(batch, dtype=np.int64))
            (parents, depths, ranks, scores), offsets = best_first_flat(marginals.probs, 64)
            request = np.repeat(np.arange(batch), np.diff(offsets))
            tokens = ranks.copy()  # synthetic token ids are the candidates' ranks
            tokens[offsets[:-1]] = -1
            walked = accepted_paths(parents, tokens, depths, offsets, target)
            if walked is None:  # pragma: no cover - needs the compiled kernel
                raise SystemExit("this script needs the compiled kernel (pip install .)")
            a_hat.append(np.bincount(request, weights=scores, minlength=batch))
            accepted.append(walked[0] + 1)
        a, t = np.array(a_hat), np.array(accepted, dtype=float)  # [steps, requests]
        out[name] = {
            "pearson_per_step": float(np.corrcoef(a.ravel(), t.ravel())[0, 1]),
            "pearson_per_request": float(np.corrcoef(a.mean(axis=0), t.mean(axis=0))[0, 1]),
            "steps": int(a.size),
            "requests": batch,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the JSON")
    args = parser.parse_args(argv)
    size = {"requests": 3, "output_len": 128} if args.quick else {"requests": 8, "output_len": 512}
    sections = {
        "headline": lambda: headline(size),
        "ddtree_sweep": lambda: ddtree_sweep(size),
        "batched": lambda: batched(size),
        "moe": lambda: moe(size),
        "calibration": calibration,
        "proxy_correlation": lambda: proxy_correlation(2_000 if args.quick else 20_000),
    }
    results = {}
    for name, compute in sections.items():
        print(f"{name} …", file=sys.stderr, flush=True)
        results[name] = compute()
    write_text_atomic(args.out, json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
