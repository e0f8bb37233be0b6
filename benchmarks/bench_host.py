"""Host-side costs for the simulator's ground truth: measures the constants of its host model.

Measured on this machine, each a median over ``--repeats`` of back-to-back calls:

- the best-first tree builder of ``fixed:N`` (``bastion.policies.best_first_batch``) for
  B ∈ {1, 8, 32} requests and N ∈ {16, 64, 256} (``math`` marginals, depth 15), fitted by least
  squares as ``tree_step_s + B·tree_request_s + ΣN·tree_node_s``;
- the host's ancestor matrix of each tree (``bastion.tree.ancestor_matrix``, what the real
  backend builds before uploading the mask), fitted as ``B·mask_host_request_s +
  ΣN²·mask_host_element_s``;
- the adaptive controller's host time per step (the ``bastion`` policy's choice and learning
  over a decode with growing contexts, ``bench_learning.py``'s loop; tree growth included): at
  batch 1 the single-request controller (``controller_single_s``), above it the joint chooser,
  fitted as ``controller_step_s + B·controller_request_s`` — each the mean over the steps that
  decided; the steps that repeated the last decision (``bastion:every=K``) the same way
  (``controller_repeat_*``); and a step of a chain decision that stood (the argmax path,
  ``bench_learning.py --standing``'s loop, the mean over steps) the same way
  (``controller_chain_*``);
- with torch and transformers installed: the host time of a Hugging Face Qwen3 forward pass in
  eager mode (a tiny configuration on the CPU, so that the kernels themselves cost next to
  nothing and what is timed is Python and the dispatcher), for 2 and 6 layers, one decode token
  over a 64-token cache: the slope is ``host_layer_s``, the rest ``pass_overhead_s`` (embedding,
  mask and cache bookkeeping, final norm, LM head dispatch), and one softmax on 64 elements gives
  ``host_kernel_s`` (one op's dispatch). torch runs on one thread. Not included: the CUDA
  launch call itself (a few µs per kernel), absent on the CPU.

It prints the ``[host]`` table of a truth file; ``--write FILE…`` replaces the lines between
``# BEGIN bench_host`` and ``# END bench_host`` of each given truth file (atomically). The host
machine of a real run is faster or slower than this one: the numbers are this machine's.

Run: ``python benchmarks/bench_host.py [--repeats 15] [--write sim/truths/hf-eager.toml …]``.
Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
from bench_joint import median_time  # the same timing rule (benchmarks/ is on sys.path)
from bench_learning import run as run_learning  # the controller's per-step loop
from bench_learning import standing  # … and a standing chain decision's step

from bastion.batch import BatchMarginals
from bastion.files import write_text_atomic
from bastion.policies import best_first_batch
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.truth import SECTIONS
from bastion.sim.workloads import get_workload
from bastion.tree import ancestor_matrix

BATCHES = (1, 8, 32)
SIZES = (16, 64, 256)
# block name → its keys: "host" in every truth file, "eager" only where the framework is eager
BLOCKS = {
    "host": SECTIONS["host"],  # every key of the truth files' [host] table
    "eager": ("host_layer_s", "pass_overhead_s"),
}


def marginals(b: int, seed: int = 0) -> BatchMarginals:
    source = SyntheticSource(get_workload("math"), seed)
    slots = np.arange(b)
    for i in range(b):
        source.admit(i, i)
    return source.draft(slots, slots)[0]


def fit(rows: list[list[float]], seconds: list[float]) -> list[float]:
    """Non-negative least squares (dropping negative terms and refitting) of seconds on rows."""
    a = np.array(rows, dtype=np.float64)  # one row per measurement
    y = np.array(seconds)
    keep = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while keep:
        sol, *_ = np.linalg.lstsq(a[:, keep], y, rcond=None)
        if np.all(sol >= 0):
            coef[keep] = sol
            break
        keep.pop(int(np.argmin(sol)))
    return coef.tolist()


def tree_constants(repeats: int) -> dict[str, float]:
    cols, build, mask = [], [], []
    for b in BATCHES:
        m = marginals(b)
        for n in SIZES:
            trees = best_first_batch(m, n)
            build.append(median_time(lambda m=m, n=n: best_first_batch(m, n), repeats))
            singles = trees.trees()
            mask.append(median_time(lambda s=singles: [ancestor_matrix(t) for t in s], repeats))
            cols.append([1.0, float(b), float(b * n), float(b * n * n)])
    step, request, node = fit([c[:3] for c in cols], build)
    m_request, m_element = fit([[c[1], c[3]] for c in cols], mask)
    return {
        "tree_step_s": step,
        "tree_request_s": request,
        "tree_node_s": node,
        "mask_host_request_s": m_request,
        "mask_host_element_s": m_element,
    }


def controller_constants(repeats: int) -> dict[str, float]:
    """The ``bastion`` policy's host time per decode step as the serving loop pays it: its
    choice *and* its learning (``observe_step``), over consecutive steps of a decode whose
    contexts grow (``benchmarks/bench_learning.py``'s loop: learned cost model calibrated at
    start-up on the simulated GPU, tree growth included). At batch 1 the single-request
    controller (``controller_single_s``); above it the joint chooser, fitted as
    ``controller_step_s + B·controller_request_s`` over the batched sizes."""
    steps = max(100, 20 * repeats)
    every = 16  # repeated steps measured between decisions standing for up to 16 steps
    cols: list[list[float]] = []
    decide: list[float] = []
    repeat: list[float] = []
    single = single_repeat = 0.0
    for b in BATCHES:
        r = run_learning(b, steps, 3, every)
        if b == 1:
            single, single_repeat = 1e-6 * r["decide_us"], 1e-6 * r["repeat_us"]
        else:
            decide.append(1e-6 * r["decide_us"])
            repeat.append(1e-6 * r["repeat_us"])
            cols.append([1.0, float(b)])
    # a chain decision that stood: its step on the argmax path (the mean over steps)
    chain = {b: 1e-6 * standing(b, steps, 3, ("chain",))["chain_mean_us"] for b in BATCHES}
    chain_step, chain_request = fit(cols, [chain[b] for b in BATCHES if b > 1])
    step, request = fit(cols, decide)
    # −1: not measured (no step repeated a decision — at batch 1 none does): charged as one
    single_repeat = single_repeat if np.isfinite(single_repeat) else -1.0
    step_r, request_r = fit(cols, repeat) if all(np.isfinite(repeat)) else (-1.0, -1.0)
    return {
        "controller_single_s": single,
        "controller_step_s": step,
        "controller_request_s": request,
        "controller_repeat_single_s": single_repeat,
        "controller_repeat_step_s": step_r,
        "controller_repeat_request_s": request_r,
        "controller_chain_single_s": chain[1],
        "controller_chain_step_s": chain_step,
        "controller_chain_request_s": chain_request,
    }


def eager_constants(repeats: int) -> dict[str, float]:
    try:
        import torch
        from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM
    except ImportError:
        return {}
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny tensors: a thread pool would only add hand-off time

    def model(layers: int) -> Callable[[], object]:
        cfg = Qwen3Config(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            attn_implementation="sdpa",
        )
        net = Qwen3ForCausalLM(cfg).eval()
        ids = torch.zeros((1, 64), dtype=torch.long)
        with torch.inference_mode():
            cache = DynamicCache(config=cfg)
            net(input_ids=ids, cache=cache, use_cache=True)
        one = torch.zeros((1, 1), dtype=torch.long)

        def step() -> object:
            with torch.inference_mode():
                out = net(input_ids=one, cache=cache, use_cache=True)
                cache.crop(-1)  # back to the 64-token cache
            return out

        return step

    t2 = median_time(model(2), repeats)
    t6 = median_time(model(6), repeats)
    tiny = torch.zeros((1, 1, 64))  # one op's dispatch: on a GPU its work is not on the host
    kernel = median_time(lambda: torch.softmax(tiny, dim=-1), repeats)
    layer = (t6 - t2) / 4.0
    return {"host_layer_s": layer, "pass_overhead_s": t2 - 2.0 * layer, "host_kernel_s": kernel}


def toml_block(name: str, values: dict[str, float], command: str) -> str:
    lines = [
        f"# BEGIN bench_host {name}",
        f"# measured by `{command}` on {platform.machine()} "
        f"({platform.processor() or 'cpu'}), Python {platform.python_version()}, "
        f"{date.today().isoformat()}",
    ]
    lines += [f"{k} = {values[k]:.3e}" for k in BLOCKS[name] if k in values]
    lines.append(f"# END bench_host {name}")
    return "\n".join(lines)


def write_blocks(path: Path, blocks: dict[str, str]) -> list[str]:
    """Replace every named block the file holds; return the names replaced."""
    text = path.read_text(encoding="utf-8")
    done = []
    for name, block in blocks.items():
        begin, end = f"# BEGIN bench_host {name}\n", f"# END bench_host {name}"
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = head + block + tail
            done.append(name)
    if not done:
        raise SystemExit(f"{path}: no '# BEGIN bench_host NAME' … '# END bench_host NAME' block")
    write_text_atomic(path, text)
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--write", nargs="*", default=[], help="truth files to update")
    parser.add_argument("--no-eager", action="store_true", help="skip the transformers part")
    args = parser.parse_args()
    values = tree_constants(args.repeats)
    values.update(controller_constants(args.repeats))
    if not args.no_eager:
        values.update(eager_constants(args.repeats))
    command = f"python benchmarks/bench_host.py --repeats {args.repeats}"
    # a block none of whose keys was measured (--no-eager) is left as the file has it
    blocks = {
        name: toml_block(name, values, command)
        for name, keys in BLOCKS.items()
        if any(k in values for k in keys)
    }
    print("\n".join(blocks.values()))
    for f in args.write:
        print(f"{f}: replaced {', '.join(write_blocks(Path(f), blocks))}")


if __name__ == "__main__":
    main()
