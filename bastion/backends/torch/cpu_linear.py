"""Weight-streaming linear layers for CPU decoding: the compiled ``_cpulinear`` product in place of
``nn.Linear``, so a pass over 16 tokens costs little more than a pass over one (as on a GPU).

PyTorch's fp32 products with a handful of rows re-pack the whole weight matrix at every call; on
the demo's base target a 16-token pass costs 1.8× a one-token pass although both read the same
weights. :class:`StreamingLinear` streams each weight row once per call and multiplies it against
every input row while it is in registers (``python benchmarks/bench_cpu_linear.py`` measures
both). Each output is summed in the same order whatever the number of rows in the pass, so a
token's linear layers give the same bits alone and beside 63 others (batch invariance; attention
and norms stay PyTorch's), and weights that are exactly bf16 values are kept as bf16 — the same
products at half the bytes.

:func:`stream_linears` swaps a model's eligible ``nn.Linear`` modules in place; it is what
``load_target(..., linears="stream")`` and the DFlash loader call on CPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bastion.errors import ConfigError

LINEAR_CHOICES = ("auto", "stream", "torch")

try:  # the compiled kernel is optional (setup.py): without it PyTorch's products are used
    from bastion.backends.torch import _cpulinear as _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _kernel = None


def kernel_available() -> bool:
    """Whether the compiled kernel was built and this CPU has its instructions (AVX-512, or
    AVX2 and FMA)."""
    return _kernel is not None and bool(_kernel.available())


def check_linears(linears: object) -> str:
    """``linears`` validated: ``auto`` (stream where possible), ``stream`` (required) or
    ``torch``."""
    if not isinstance(linears, str) or linears not in LINEAR_CHOICES:
        raise ConfigError(f"linears must be one of {', '.join(LINEAR_CHOICES)}, got {linears!r}")
    if linears == "stream" and not kernel_available():
        raise ConfigError(
            "linears='stream' needs the compiled bastion.backends.torch._cpulinear kernel and an "
            "x86-64 CPU with AVX-512 or AVX2; use linears='torch' (or 'auto') on this machine"
        )
    return linears


def _exactly_bf16(weight: torch.Tensor) -> bool:
    return bool(torch.equal(weight.to(torch.bfloat16).to(weight.dtype), weight))


class StreamingLinear(nn.Module):
    """``y = x Wᵀ + b`` by the weight-streaming kernel (fp32 activations; fp32 or exact-bf16 W).

    For inference: ``weight`` and ``bias`` stay the original parameters (so ``parameters()``,
    ``state_dict()``, saving and tied embeddings are unchanged), and the kernel reads a packed
    copy made at construction — bf16 where every weight is exactly a bf16 value, else the fp32
    tensor itself. Changing the weights afterwards (training) needs a new module.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    packed: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = weight  # an nn.Parameter stays registered as one
        self.bias = bias
        w = weight.detach()
        packed = w.to(torch.bfloat16) if _exactly_bf16(w) else w.to(torch.float32)
        self.register_buffer("packed", packed.contiguous(), persistent=False)
        self.out_features, self.in_features = (int(d) for d in w.shape)
        self._bf16 = int(packed.dtype == torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return nn.functional.linear(x, self.weight.to(x.dtype), bias)
        rows = x.reshape(-1, self.in_features).contiguous()
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        if rows.shape[0] > 0:
            assert _kernel is not None  # construction requires it (stream_linears)
            _kernel.linear_nt(
                rows.data_ptr(),
                self.packed.data_ptr(),
                y.data_ptr(),
                rows.shape[0],
                self.out_features,
                self.in_features,
                self._bf16,
            )
        if self.bias is not None:
            y += self.bias.detach()
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        kind = "bf16" if self._bf16 else "fp32"
        return f"in_features={self.in_features}, out_features={self.out_features}, packed={kind}"


def _eligible(module: nn.Module) -> bool:
    return (
        type(module) is nn.Linear
        and module.weight.dtype == torch.float32
        and module.weight.device.type == "cpu"
        and module.in_features % 16 == 0
    )


def stream_linears(model: nn.Module) -> int:
    """Swap every eligible ``nn.Linear`` of ``model`` (fp32, on CPU, input width a multiple of
    16) for a :class:`StreamingLinear`, in place; the number swapped. Tied weights (an LM head
    sharing the embedding) keep working: the embedding keeps its own tensor.

    Raises ConfigError where the kernel is unavailable (check :func:`kernel_available`).
    """
    if not kernel_available():
        raise ConfigError("the weight-streaming kernel is not available on this machine")
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and _eligible(child):
                setattr(parent, name, StreamingLinear(child.weight, child.bias))
                swapped += 1
    return swapped


def streams(model: Any) -> bool:
    """Whether ``model`` (any ``nn.Module``) multiplies with the weight-streaming kernel."""
    return isinstance(model, nn.Module) and any(
        isinstance(m, StreamingLinear) for m in model.modules()
    )


def apply_linears(model: Any, linears: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Apply the ``linears`` choice to a freshly loaded ``model``; whether it now streams."""
    choice = check_linears(linears)
    wants = choice == "stream" or (
        choice == "auto" and device.type == "cpu" and dtype == torch.float32 and kernel_available()
    )
    if not wants:
        return False
    if device.type != "cpu" or dtype != torch.float32:
        raise ConfigError(
            f"linears='stream' runs fp32 models on CPU; this one is {dtype} on {device.type}"
        )
    return stream_linears(model) > 0
