"""The weight-streaming CPU product against PyTorch's, on a shipped demo target.

Two tables, every cell a median over interleaved repeats in one run (the machine drifts, so the
two kernels are timed turn about, never one after the other):

1. **The linear layers alone**: all of the target's ``nn.Linear`` products (every layer, the LM
   head included) for M = 1 … 64 rows, PyTorch fp32 against the streaming kernel; the ratio of
   each to its own one-row time, and streaming ÷ PyTorch.
2. **The whole target pass** (Hugging Face forward with a KV cache of the prompt, as a decode or
   verify pass), loaded twice by ``load_target(..., linears="torch" | "stream")``: the pass by
   tokens, its ratio to the one-token pass (the cost curve speculation lives on), and streaming
   ÷ PyTorch.

Run: ``python benchmarks/bench_cpu_linear.py [--pair base|small] [--repeats 15]``. Needs the
compiled kernel (x86-64 with AVX-512, or AVX2 and FMA). Never part of the tests.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from bastion.backends.torch import load_target
from bastion.backends.torch.cpu_linear import StreamingLinear, kernel_available
from bastion.demo import DEFAULT_PAIR, PAIRS, get_pair
from bastion.errors import ConfigError

ROWS = (1, 2, 4, 8, 16, 32, 64)


def _time(fn: Callable[[], object], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def _interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, inner: int
) -> dict[str, float]:
    for fn in fns.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            samples[key].append(_time(fn, inner))
    return {k: statistics.median(v) for k, v in samples.items()}


def _linears(model: nn.Module) -> list[nn.Linear]:
    found = [m for m in model.modules() if type(m) is nn.Linear]
    head = model.get_output_embeddings()  # type: ignore[operator]
    if head is not None and all(head is not m for m in found):
        found.append(head)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=tuple(PAIRS), default=DEFAULT_PAIR)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--context", type=int, default=256, help="tokens in the KV cache")
    args = parser.parse_args()
    if not 3 <= args.repeats <= 1000 or not 1 <= args.context <= 2048:
        raise ConfigError("--repeats 3–1000, --context 1–2048")
    if not kernel_available():
        raise ConfigError("the weight-streaming kernel is not available on this machine")
    torch.manual_seed(0)
    pair = get_pair(args.pair)
    pair.require_installed()
    plain = load_target(pair.target, "cpu", linears="torch")
    fast = load_target(pair.target, "cpu", linears="stream")
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; pair {pair.name}; medians of {args.repeats} "
        "interleaved repeats"
    )

    layers = _linears(plain)
    streamed = [StreamingLinear(m.weight, m.bias) for m in layers]
    mb = sum(s.weight.numel() * s.weight.element_size() for s in streamed) / 1e6
    print(f"\n## The linear layers alone ({len(layers)} products, {mb:.1f} MB streamed)\n")
    print("| rows | PyTorch ms | × one row | streaming ms | × one row | streaming ÷ PyTorch |")
    print("|---:|---:|---:|---:|---:|---:|")
    base: dict[str, float] = {}
    with torch.no_grad():
        for m in ROWS:
            xs = {k: torch.randn(m, k) for k in {layer.in_features for layer in layers}}

            def plain_products(xs: dict[int, torch.Tensor] = xs) -> object:
                return [layer(xs[layer.in_features]) for layer in layers]

            def streamed_products(xs: dict[int, torch.Tensor] = xs) -> object:
                return [s(xs[s.in_features]) for s in streamed]

            got = _interleaved(
                {"torch": plain_products, "stream": streamed_products},
                args.repeats,
                inner=5,
            )
            base = base or got
            print(
                f"| {m} | {got['torch'] * 1e3:.2f} | {got['torch'] / base['torch']:.2f} | "
                f"{got['stream'] * 1e3:.2f} | {got['stream'] / base['stream']:.2f} | "
                f"{got['stream'] / got['torch']:.2f} |"
            )

    print(f"\n## The whole target pass (KV cache of {args.context} tokens)\n")
    print(
        "| tokens | PyTorch ms | × one token | streaming ms | × one token | streaming ÷ PyTorch |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    vocab = int(plain.config.vocab_size)
    prompt = torch.randint(0, vocab, (1, args.context))
    with torch.no_grad():
        caches = {
            name: model(prompt, use_cache=True).past_key_values
            for name, model in (("torch", plain), ("stream", fast))
        }

        def pass_of(name: str, model: nn.Module, m: int) -> Callable[[], object]:
            ids = torch.randint(0, vocab, (1, m))
            pos = torch.arange(args.context, args.context + m)[None]

            def run() -> None:
                model(ids, past_key_values=caches[name], position_ids=pos, use_cache=True)
                caches[name].crop(-m)  # back to the prompt for the next repeat

            return run

        base = {}
        for m in ROWS:
            got = _interleaved(
                {"torch": pass_of("torch", plain, m), "stream": pass_of("stream", fast, m)},
                args.repeats,
                inner=3,
            )
            base = base or got
            print(
                f"| {m} | {got['torch'] * 1e3:.2f} | {got['torch'] / base['torch']:.2f} | "
                f"{got['stream'] * 1e3:.2f} | {got['stream'] / base['stream']:.2f} | "
                f"{got['stream'] / got['torch']:.2f} |"
            )


if __name__ == "__main__":
    main()
