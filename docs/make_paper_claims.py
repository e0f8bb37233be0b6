"""The simulator's side of docs/paper-claims.md, recomputed.

    python docs/make_paper_claims.py            # about 3 minutes on 2 cores
    python docs/make_paper_claims.py --quick    # fewer and shorter requests, for a smoke test
    python docs/make_paper_claims.py --check    # where docs/paper-claims.md differs from it

Runs, through the public Python API, the simulations behind the claims that the shipped
experiments (`bastion experiment NAME`) do not already cover, and writes every number to
docs/data/paper-claims.json (atomically). Each entry records the equivalent `bastion simulate`
command. Nothing here is fitted: the workloads were fitted beforehand (docs/workloads.md says to
which numbers) and the truth files were set from measurements and sources (docs/simulator.md);
this script only runs them.

:func:`claims` derives every number docs/paper-claims.md takes from that JSON (means, ranges,
ratios), as the page must read it; ``--check`` and a test (tests/test_docs.py) compare the page
with it, so the page cannot drift from its data.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
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
DOC = Path(__file__).resolve().parent / "paper-claims.md"
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


# --------------------------------------------------------------------------------------------
# The page's numbers from the JSON: what docs/paper-claims.md must read (--check, and a test)
# --------------------------------------------------------------------------------------------

Claim = tuple[str, str]  # (a phrase that finds one table row or paragraph, the text it must hold)


def _rows(results: dict[str, Any], section: str) -> dict[str, dict[str, dict[str, float]]]:
    return {key: entry["rows"] for key, entry in results[section].items()}


def _span(values: list[float], digits: int, scale: float = 1.0, shift: float = 0.0) -> str:
    """'lo–hi' of ``values`` (scaled, shifted), each rounded to ``digits``."""
    lo, hi = (scale * min(values) + shift, scale * max(values) + shift)
    return f"{lo:.{digits}f}–{hi:.{digits}f}"


def claims(results: dict[str, Any]) -> list[Claim]:
    """Every number of docs/paper-claims.md that comes from ``results`` (the JSON this script
    writes), as the page must read it: ``text`` inside the one table row or paragraph that
    contains ``where``. The page's other numbers are the paper's or come from the experiments'
    summaries (docs/experiments/*/summary.md)."""
    paper, learning = "bastion:paper", "bastion"
    out: list[Claim] = []

    # Fig. 1 / Table 1: means over the six settings; ranges over them
    head = list(_rows(results, "headline").values())
    speed = {p: float(np.mean([r[p]["speedup"] for r in head])) for p in (paper, learning)}
    chain = {p: [r[p]["speedup"] / r["chain"]["speedup"] for r in head] for p in (paper, learning)}
    fixed = [max(v["speedup"] for k, v in r.items() if k.startswith("fixed:")) for r in head]
    beat = {p: [r[p]["speedup"] / f for r, f in zip(head, fixed, strict=True)] for p in chain}
    fixed_chain = [f / r["chain"]["speedup"] for r, f in zip(head, fixed, strict=True)]

    def over_chain(p: str) -> str:
        return f"{np.mean(chain[p]):.2f}× ({_span(chain[p], 2)})"

    out += [
        ("| Fig. 1: average speedup over AR |", f"{speed[paper]:.2f}× / {speed[learning]:.2f}×"),
        ("| Fig. 1: over DFlash (the chain) |", f"{over_chain(paper)} / {over_chain(learning)}"),
        ("**Headline (Fig. 1, Table 1).**", f"over AR is {speed[paper]:.2f}×"),
        ("**Headline (Fig. 1, Table 1).**", f"over the chain {over_chain(paper)}"),
        (
            "**Headline (Fig. 1, Table 1).**",
            f"the learning controller's {speed[learning]:.2f}× and {over_chain(learning)}",
        ),
        ("**Headline (Fig. 1, Table 1).**", f"over the chain is {_span(fixed_chain, 2)}×"),
        (
            "**Headline (Fig. 1, Table 1).**",
            f"(by {_span(beat[paper], 1, 100, -100)} % and "
            f"{_span(beat[learning], 1, 100, -100)} %)",
        ),
    ]

    # §3: host preparation's share of the cycle, per adaptive policy and for both
    def share(p: str) -> list[float]:
        return [
            r[p]["prep_ms_per_step"]
            / (r[p]["draft_ms_per_step"] + r[p]["prep_ms_per_step"] + r[p]["verify_ms_per_step"])
            for r in head
        ]

    both = share(paper) + share(learning)
    out += [
        (
            "| §3: T_aux negligible vs verification |",
            f"{_span(share(paper), 1, 100)} % / {_span(share(learning), 1, 100)} % of the cycle",
        ),
        ("**T_aux.**", f"is {_span(both, 1, 100)} % of the A100 cycle"),
    ]

    # F.1: the proxy's correlations
    corr = results["proxy_correlation"]
    step = [v["pearson_per_step"] for v in corr.values()]
    request = [v["pearson_per_request"] for v in corr.values()]
    names = ("qwen3-8b-math", "qwen3-8b-code", "qwen3-8b-chat", "qwen3-coder-30b-a3b-code")
    per_step = [corr[n]["pearson_per_step"] for n in names]
    per_request = ", ".join(f"{corr[n]['pearson_per_request']:.2f}" for n in names)
    first = corr[names[0]]
    out += [
        (
            "| F.1: Pearson(Â, acceptance) |",
            f"per step {_span(step, 2)}; per request {_span(request, 2)}",
        ),
        (
            "**Â as a proxy (F.1).**",
            "is {:.2f} (math), {:.2f} (code), {:.2f} (chat), {:.2f} (MoE coder)".format(*per_step),
        ),
        (
            "**Â as a proxy (F.1).**",
            f"(its means over {first['steps'] // first['requests']} steps, {first['requests']} "
            f"requests) {per_request}",
        ),
    ]

    # Tables 2–3: the batched runs
    batch = _rows(results, "batched")
    c16m, c16c = batch["C16/math"], batch["C16/code"]

    def fixed_best(r: dict[str, dict[str, float]]) -> float:
        return max(v["throughput"] for k, v in r.items() if k.startswith("fixed:"))

    best = {
        p: [r[p]["throughput"] / fixed_best(r) for r in batch.values()] for p in (paper, learning)
    }
    half = {
        c: [
            batch[f"C{c}/{w}"]["fixed:64"]["throughput"]
            / batch[f"C{c}/{w}"]["fixed:16"]["throughput"]
            for w in ("math", "code")
        ]
        for c in (16, 64)
    }
    above = c16m["fixed:64"]["throughput"] / 573.0 - 1.0  # the paper's 573 tok/s
    out += [
        (
            "| Table 2: τ at N = 64 under batching |",
            f"{c16m['fixed:64']['tau']:.2f} (math), {c16c['fixed:64']['tau']:.2f} (code) at C = 16",
        ),
        (
            "| Table 2: N = 64 throughput vs N = 16 |",
            f"{c16m['fixed:64']['throughput']:.0f} vs {c16m['fixed:16']['throughput']:.0f} (math), "
            f"{c16c['fixed:64']['throughput']:.0f} vs {c16c['fixed:16']['throughput']:.0f} (code) "
            "tok/s at C = 16",
        ),
        (
            "| Table 2: adaptive vs best fixed N |",
            f"{_span(best[paper], 0, 100)} % / {_span(best[learning], 0, 100)} % (C = 16, 36, 64)",
        ),
        (
            "**Batched throughput (Table 2).**",
            f"the paper's by {_span(best[paper], 0, 100, -100)} %, the learning one by "
            f"{_span(best[learning], 0, 100, -100)} % (`batched`)",
        ),
        (
            "**Batched throughput (Table 2).**",
            "N = 64's throughput is {:.2f} (math) and {:.2f} (code) of N = 16's at C = 16 and "
            "{:.2f} and {:.2f} at C = 64".format(*half[16], *half[64]),
        ),
        (
            "**Batched throughput (Table 2).**",
            f"its {c16m['fixed:64']['throughput']:.0f} tok/s at C = 16 on math is "
            f"{100 * above:.0f} % above the paper's 573 tok/s",
        ),
    ]
    c64 = [batch["C64/math"], batch["C64/code"]]  # Table 3: the mean of the two workloads

    def more(field: Any) -> float:
        return float(np.mean([100 * (field(r["fixed:16"]) / field(r["chain"]) - 1) for r in c64]))

    prep = more(lambda x: x["draft_ms_per_step"] + x["prep_ms_per_step"])
    verify = more(lambda x: x["verify_ms_per_step"])
    cycle = more(lambda x: x["draft_ms_per_step"] + x["prep_ms_per_step"] + x["verify_ms_per_step"])
    tau = more(lambda x: x["tau"])
    width = float(np.mean([r["fixed:16"]["mean_batch"] for r in c64]))
    out += [
        ("| Table 3: N = 16 tree vs chain, preparation", f"+{prep:.0f} % (C = 64)"),
        ("| Table 3: verification |", f"| +{verify:.0f} % |"),
        ("| Table 3: step time for accepted tokens |", f"≈ +{cycle:.0f} % for +{tau:.1f} %"),
        (
            "**Per-step decomposition (Table 3).**",
            f"At C = 64 (effective batch ≈ {width:.0f}) the N = 16 tree costs +{prep:.0f} % "
            f"preparation",
        ),
        (
            "**Per-step decomposition (Table 3).**",
            f"+{verify:.0f} % verification, so its step is ≈ {cycle:.0f} % slower for "
            f"+{tau:.1f} % τ",
        ),
    ]

    # Fig. 7: the calibration's RMSE
    cal = results["calibration"]
    q, ll = cal["qwen3-8b"], cal["llama-3.1-8b"]

    def cut(m: dict[str, float]) -> float:
        return 100 * (1 - m["rmse_calibrated_ms"] / m["rmse_bare_ms"])

    out += [
        (
            "| Fig. 7: calibration cuts the bare RMSE |",
            f"−{cut(q):.0f} % / −{cut(ll):.0f} % ({q['rmse_bare_ms']:.1f} → "
            f"{q['rmse_calibrated_ms']:.2f}, {ll['rmse_bare_ms']:.1f} → "
            f"{ll['rmse_calibrated_ms']:.2f} ms)",
        ),
        (
            "**Calibration and cost modes (Fig. 7, §5.2).**",
            f"is {q['rmse_bare_ms']:.1f} ms (Qwen3-8B) and {ll['rmse_bare_ms']:.1f} ms "
            f"(Llama-3.1-8B), calibrated {q['rmse_calibrated_ms']:.2f} and "
            f"{ll['rmse_calibrated_ms']:.2f} ms (−{cut(q):.0f} %, −{cut(ll):.0f} %",
        ),
    ]

    # Tables 5–6: the fixed-N sweep; means over the three workloads
    sweep = _rows(results, "ddtree_sweep")
    models = ("qwen3-8b", "llama-3.1-8b")
    n_best, mean, recovery = {}, {}, {}
    for model in models:
        rows = [r for key, r in sweep.items() if key.startswith(model + "/")]
        sizes = [k for k in rows[0] if k.startswith("fixed:")]
        n_best[model] = max(sizes, key=lambda k: np.mean([r[k]["speedup"] for r in rows]))[6:]
        for p in (paper, learning):
            mean[model, p] = float(np.mean([r[p]["speedup"] for r in rows]))
            recovery[model, p] = 100 * float(
                np.mean([r[p]["speedup"] / max(r[k]["speedup"] for k in sizes) for r in rows])
            )

    def pair(values: dict[Any, float], p: str, unit: str, digits: int, sep: str) -> str:
        return sep.join(f"{values[m, p]:.{digits}f}{unit}" for m in models)

    out += [
        ("| Table 5: best fixed N (A100 40 GB) |", f"| {n_best[models[0]]}, {n_best[models[1]]} |"),
        (
            "| Table 6: adaptive speedup |",
            f"{pair(mean, paper, '×', 2, ' / ')} (paper's); {pair(mean, learning, '×', 2, ' / ')} "
            "(learning)",
        ),
        (
            "| Table 6: recovery of the best fixed |",
            f"{pair(recovery, paper, ' %', 1, ' / ')} (paper's); "
            f"{pair(recovery, learning, ' %', 1, ' / ')} (learning)",
        ),
        (
            "**DDTree comparison (Tables 5–6).**",
            f"the paper's controller reaches {pair(mean, paper, '×', 2, ' and ')}",
        ),
        ("**DDTree comparison (Tables 5–6).**", f"{pair(recovery, paper, ' %', 1, ' and ')} of"),
        (
            "**DDTree comparison (Tables 5–6).**",
            f"the learning controller {pair(mean, learning, '×', 2, ' and ')}, "
            f"{pair(recovery, learning, ' %', 1, ' and ')}",
        ),
    ]
    if n_best[models[0]] == n_best[models[1]]:
        out.append(("**DDTree comparison (Tables 5–6).**", f"is {n_best[models[0]]} for both"))

    # Tables 7–8: the MoE coder
    moe = results["moe"]["code"]["rows"]
    sizes = sorted(int(k[6:]) for k in moe if k.startswith("fixed:"))
    curve = [moe[f"fixed:{n}"]["speedup"] for n in sizes]
    lo, hi = moe[f"fixed:{sizes[0]}"], moe[f"fixed:{sizes[-1]}"]
    best_n = sizes[int(np.argmax(curve))]
    falling = all(b < a for a, b in itertools.pairwise(curve))
    p_row, l_row, c_row = moe[paper], moe[learning], moe["chain"]
    shape = f"N = {best_n} best" + (", monotone" if falling else "")
    out += [
        ("| Table 7: MoE τ from N = 16 to 1025 |", f"{lo['tau']:.2f} → {hi['tau']:.2f}"),
        (
            "| Table 7: MoE speedup falls from N = 16 |",
            f"{lo['speedup']:.2f}× → {hi['speedup']:.2f}×, {shape}",
        ),
        (
            "| Table 8: MoE adaptive vs DFlash |",
            f"paper's {p_row['speedup']:.2f}× τ {p_row['tau']:.1f} / learning "
            f"{l_row['speedup']:.2f}× τ {l_row['tau']:.2f}, vs chain {c_row['speedup']:.2f}× "
            f"τ {c_row['tau']:.2f}",
        ),
        (
            "**MoE (Tables 7–8).**",
            f"τ rises from {lo['tau']:.2f} (N = {sizes[0]}) to {hi['tau']:.2f} (N = {sizes[-1]})",
        ),
        (
            "**MoE (Tables 7–8).**",
            f"from {lo['speedup']:.2f}× at N = {sizes[0]} to {hi['speedup']:.2f}× at "
            f"N = {sizes[-1]}",
        ),
        ("**MoE (Tables 7–8).**", f"beats AR and the chain ({c_row['speedup']:.2f}×)"),
        (
            "**MoE (Tables 7–8).**",
            f"({p_row['speedup']:.2f}×, τ {p_row['tau']:.1f} at N ≈ {p_row['mean_n']:.0f})",
        ),
        (
            "**MoE (Tables 7–8).**",
            f"({l_row['speedup']:.2f}×, τ {l_row['tau']:.2f} at N ≈ {l_row['mean_n']:.0f}; "
            f"{l_row['speedup'] / c_row['speedup']:.2f}× the chain",
        ),
        (
            "**MoE (Tables 7–8).**",
            f"{l_row['speedup'] / max(curve):.2f}× the best fixed tree",
        ),
    ]
    if falling:
        out.append(("**MoE (Tables 7–8).**", "falls monotonically"))
    return out


def blocks(markdown: str) -> list[str]:
    """The page's table rows (one each) and paragraphs, whitespace collapsed."""
    out: list[str] = []
    for part in re.split(r"\n\s*\n", markdown):
        lines = part.strip().splitlines()
        if lines and all(line.startswith("|") for line in lines):
            out += [" ".join(line.split()) for line in lines]
        elif lines:
            out.append(" ".join(" ".join(lines).split()))
    return out


def drift(markdown: str, results: dict[str, Any]) -> list[str]:
    """How docs/paper-claims.md (``markdown``) differs from ``results``: one line per number
    that does not read as the JSON gives it (empty when the page matches)."""
    found = blocks(markdown)
    problems = []
    for where, text in claims(results):
        at = [b for b in found if " ".join(where.split()) in b]
        if len(at) != 1:
            problems.append(f"{len(at)} rows or paragraphs hold {where!r} (need exactly one)")
        elif " ".join(text.split()) not in at[0]:
            problems.append(f"{where!r} should read {text!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter requests")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the JSON")
    parser.add_argument(
        "--check",
        action="store_true",
        help="compute nothing: say where docs/paper-claims.md differs from the JSON",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = drift(DOC.read_text(encoding="utf-8"), json.loads(OUT.read_text()))
        print("\n".join(problems) or f"{DOC.name} matches {OUT.name}")
        return 1 if problems else 0
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
