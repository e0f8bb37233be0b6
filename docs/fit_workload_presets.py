"""Fit the shipped workloads (workloads/*.toml) to the paper's published acceptance numbers.

Shape assumptions, shared by every preset (a DFlash block-16 drafter; not fitted to anything —
see docs/workloads.md for why each is what it is): ``SHAPE`` below. The parameters per family
are fitted by least squares with common random numbers
(bastion.sim.workload_fit.fit_to_targets): the head log-odds level (``top1``) and the
isolated-fork rate (``fork_rate``); for the MoE coder also the alignment λ (``alignment``),
which the qwen3-8b presets share.

- qwen3-coder-30b-a3b-code: fitted on chain τ 7.43, N = 16 τ 8.22 (Tables 7–8) and N = 1025
  τ 10.60 (Table 7); held out: the adaptive policy's τ 8.56 (Table 8), simulated.
- qwen3-8b-math and qwen3-8b-code, fitted *together* (their mean, as the paper averages
  HumanEval and MATH500) on N = 64 τ 9.22 and τ(16)/τ(chain) = 1.089 (Tables 2–3); math's
  level is +0.25 log-odds above code's (an assumption: the paper gives only the average).
  Nothing of the paper is left to hold out for this family.
- qwen3-8b-chat: not fitted to the paper (it gives no chat acceptance in its text): the
  qwen3-8b fork rate, and a level giving chain τ 3.5 (the earlier preset's value).
- llama-3.1-8b-long: nothing fitted. Long-document prompts (median 16k tokens, log-normal
  σ 0.7, clipped to 128k: the model's context) with short answers (median 256); its acceptance
  is the chat preset's, as read from workloads/qwen3-8b-chat.toml (an assumption: no published
  acceptance of a DFlash drafter on long inputs). ``--only long`` writes just this file.

Each file gets a ``[fit]`` table and ``[[fit.check]]`` rows: τ as the preset gives it
(2048 requests × 32 steps, seed 0), which tests/test_workloads.py holds it to.

Run: ``python docs/fit_workload_presets.py [--out workloads]`` (≈ 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bastion.sim.workload_fit import Target, fit_to_targets, synthetic_tau
from bastion.sim.workloads import Workload, read_workload_file, write_workload

SHAPE = {
    "decay": 1.0,
    "concentration": 0.1,
    "tail_alpha": 2.0,
    "alignment": 1.1,
    "difficulty_sd": 0.5,
    "step_sd": 2.0,
    "position_sd": 0.4,
    "fork_ratio_min": 0.3,
    "branch_rate": 0.1,
    "branch_len": 2.0,
    "temperature_penalty": 0.08,
    "temperature_spread": 0.5,
}
LENGTHS = {
    "math": {"prompt_len_sigma": 0.4, "output_len_sigma": 0.5, "prompt_len_max": 4096},
    "code": {"prompt_len_sigma": 0.6, "output_len_sigma": 0.6, "prompt_len_max": 8192},
    "chat": {"prompt_len_sigma": 1.0, "output_len_sigma": 0.8, "prompt_len_max": 16384},
}
CHECK = {"requests": 2048, "steps": 32, "seed": 0}
ADAPTIVE_REQUESTS = 16


def _adaptive_tau(w: Workload) -> float:
    """τ of the adaptive policy on the simulated A100 80GB serving the MoE target at batch 1."""
    import tempfile

    from bastion.sim.simulate import SimSpec, simulate

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{w.name}.toml"
        write_workload(path, w)
        spec = SimSpec(
            model="qwen3-coder-30b-a3b",
            gpu="a100-sxm-80gb",
            workload=str(path),
            policies=("bastion",),
            requests=ADAPTIVE_REQUESTS,
        )
        return simulate(spec).row("bastion").tau


PAPER = "Bastion paper (arXiv), appendix F.4 Tables 7–8 and §4.4 Tables 2–3"


def _workload(name: str, dataset: str, description: str, **extra: float) -> Workload:
    return Workload(
        name,
        top1=0.97,
        **{"fork_rate": 0.25, **SHAPE, **extra},  # type: ignore[arg-type]
        **LENGTHS[dataset],  # type: ignore[arg-type]
        output_len_max=8192,
        description=description,
    )


def _checks(w: Workload, rows: list[tuple[object, float | None, str]]) -> list[dict[str, object]]:
    sizes = sorted({n for n, _, _ in rows}, key=str)
    taus = synthetic_tau(w, sizes, **CHECK)  # type: ignore[arg-type]
    out = []
    for n, paper, role in rows:
        row: dict[str, object] = {"n": n, "tau": round(taus[n], 4), "role": role}  # type: ignore[index]
        if paper is not None:
            row["paper_tau"] = paper
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("workloads"))
    parser.add_argument("--requests", type=int, default=1024, help="synthetic requests per fit")
    parser.add_argument(
        "--only", choices=("long",), help="write only this preset (it fits nothing: seconds)"
    )
    args = parser.parse_args()
    if args.only == "long":
        _long_context(args.out)
        return
    shape_note = "shape parameters are assumptions shared by every preset (docs/workloads.md)"

    # Qwen3-Coder-30B-A3B on HumanEval / LiveCodeBench / MBPP
    moe = _workload(
        "qwen3-coder-30b-a3b-code",
        "code",
        "Qwen3-Coder-30B-A3B-Instruct + its DFlash b16 drafter, code (HumanEval, "
        "LiveCodeBench, MBPP), T = 0",
    )
    (moe,), got = fit_to_targets(
        [moe.with_(top1=0.9877, fork_rate=0.273)],
        [0.0],
        [Target("chain", 7.43), Target(16, 8.22), Target(1025, 10.60)],
        free=("top1", "fork_rate", "alignment"),
        requests=args.requests // 4,
    )
    print("moe", moe.top1, moe.fork_rate, moe.alignment, got, flush=True)
    adaptive = _adaptive_tau(moe)
    print("moe adaptive τ", adaptive, flush=True)
    write_workload(
        args.out / f"{moe.name}.toml",
        moe,
        (),
        {
            "source": PAPER,
            "fitted": (
                "top1, fork_rate, alignment on chain τ 7.43 (Table 8), N = 16 τ 8.22 and "
                "N = 1025 τ 10.60 (Table 7)"
            ),
            "held_out": (
                f"adaptive τ 8.56 (Table 8): {adaptive:.2f} in `bastion simulate --model "
                f"qwen3-coder-30b-a3b --gpu a100-sxm-80gb --policy bastion` ({ADAPTIVE_REQUESTS} "
                "requests; depends on the simulated GPU, which chooses the adaptive N)"
            ),
            "assumed": shape_note,
            "command": "python docs/fit_workload_presets.py",
            "check": _checks(
                moe,
                [
                    ("chain", 7.43, "fitted"),
                    (16, 8.22, "fitted"),
                    (1025, 10.60, "fitted"),
                    (64, None, "model"),
                ],
            ),
        },
    )

    # Qwen3-8B on HumanEval + MATH500 (the paper's average of the two)
    offset = 0.25
    shared = {"alignment": moe.alignment}
    math_w = _workload(
        "qwen3-8b-math",
        "math",
        "Qwen3-8B + DFlash b16 drafter, math (MATH500-like), T = 0",
        **shared,
    )
    code_w = _workload(
        "qwen3-8b-code",
        "code",
        "Qwen3-8B + DFlash b16 drafter, code (HumanEval-like), T = 0",
        **shared,
    )
    (math_w, code_w), got = fit_to_targets(
        [math_w, code_w],
        [offset, -offset],
        [Target(64, 9.22), Target(16, 1.089, ratio_to="chain")],
        requests=args.requests,
    )
    print("qwen3-8b", math_w.top1, code_w.top1, math_w.fork_rate, got)
    mean = synthetic_tau(math_w, ("chain", 16, 64), **CHECK)  # type: ignore[arg-type]
    mean2 = synthetic_tau(code_w, ("chain", 16, 64), **CHECK)  # type: ignore[arg-type]
    pooled64 = (mean[64] + mean2[64]) / 2
    pooled_ratio = (mean[16] + mean2[16]) / (mean["chain"] + mean2["chain"])
    for w, alias in ((math_w, "math"), (code_w, "code")):
        write_workload(
            args.out / f"{w.name}.toml",
            w,
            (alias,),
            {
                "source": PAPER,
                "fitted": (
                    "top1 level and fork_rate, jointly with the other qwen3-8b math/code preset, "
                    "on their mean: N = 64 τ 9.22 (Table 2) and τ(16)/τ(chain) 1.089 (Table 3)"
                ),
                "pooled_fit": {"tau_64": round(pooled64, 4), "ratio_16": round(pooled_ratio, 4)},
                "held_out": "none (the paper gives no other Qwen3-8B acceptance in its text)",
                "assumed": f"{shape_note}; math's level is code's + {2 * offset} log-odds",
                "command": "python docs/fit_workload_presets.py",
                "check": _checks(
                    w, [("chain", None, "model"), (16, None, "model"), (64, None, "model")]
                ),
            },
        )

    # chat: not fitted to the paper
    chat = _workload(
        "qwen3-8b-chat",
        "chat",
        "Qwen3-8B + DFlash b16 drafter, chat; level set to chain τ 3.5 (not a paper number)",
        fork_rate=math_w.fork_rate,
        **shared,
    )
    lo, hi = -4.0, 8.0
    for _ in range(20):
        mid = (lo + hi) / 2
        w = chat.with_(top1=1 / (1 + math.exp(-mid)))
        if synthetic_tau(w, ("chain",), args.requests, 32, 0)["chain"] < 3.5:
            lo = mid
        else:
            hi = mid
    chat = chat.with_(top1=1 / (1 + math.exp(-lo)))
    write_workload(
        args.out / f"{chat.name}.toml",
        chat,
        ("chat",),
        {
            "source": "none: the paper's chat acceptance is only in its tables",
            "fitted": "top1 level to chain τ 3.5 (the earlier hand-tuned preset; an assumption)",
            "held_out": "none",
            "assumed": f"{shape_note}; fork_rate from the qwen3-8b math/code fit",
            "command": "python docs/fit_workload_presets.py",
            "check": _checks(
                chat, [("chain", 3.5, "fitted"), (16, None, "model"), (64, None, "model")]
            ),
        },
    )
    print("chat", chat.top1)
    _long_context(args.out)


def _long_context(out: Path) -> None:
    """llama-3.1-8b-long: the chat preset's acceptance (read from ``out``) with long prompts."""
    chat = read_workload_file(out / "qwen3-8b-chat.toml").workload
    long_w = chat.with_(
        name="llama-3.1-8b-long",
        description=(
            "Llama-3.1-8B + DFlash b16 drafter, long-document QA (median 16k-token prompts, up "
            "to 128k); acceptance assumed equal to the chat preset's (not fitted)"
        ),
        prompt_len=16_384,
        prompt_len_sigma=0.7,
        prompt_len_max=131_072,
        output_len=256,
        output_len_sigma=0.8,
        output_len_max=4096,
    )
    write_workload(
        out / f"{long_w.name}.toml",
        long_w,
        ("long",),
        {
            "source": "none: no published DFlash acceptance on long inputs",
            "fitted": "nothing",
            "held_out": "none",
            "assumed": (
                "acceptance (drafter and target tables) copied from qwen3-8b-chat; lengths "
                "(16k median prompt, σ 0.7, 128k cap = Llama-3.1's context; 256-token answers, "
                "σ 0.8) chosen to resemble long-document QA, not measured on a dataset"
            ),
            "command": "python docs/fit_workload_presets.py --only long",
            "check": _checks(
                long_w, [("chain", None, "model"), (16, None, "model"), (64, None, "model")]
            ),
        },
    )
    print("long", long_w.prompt_len)


if __name__ == "__main__":
    main()
