"""The real backend: Hugging Face causal-LM targets and DFlash drafters under the shared engine.

- :mod:`.sampling`      the target's processed distribution (temperature, top-k, top-p), sampling
- :mod:`.verifier`      tree verification: 4D tree mask, one forward pass, acceptance, KV compaction
- :mod:`.dflash_format` the DFlash checkpoint format: config layouts, key names, read/write
- :mod:`.drafter`       the DFlash block-diffusion drafter with its own context KV cache
- :mod:`.timing`        device-synchronised clock and the calibration hook ``verify_timer``
- :mod:`.runner`        loading models and running one request through :class:`SpecEngine`

Importing this package imports torch and transformers. What it does not do: batching across
requests (batch 1 only) or hybrid/recurrent caches (they cannot be cropped; see peers.md).
"""

from __future__ import annotations

from bastion.backends.torch.drafter import DFlashDrafter
from bastion.backends.torch.runner import GenerationReport, generate, load_target
from bastion.backends.torch.sampling import SamplingParams
from bastion.backends.torch.verifier import TargetFeedback, TorchVerifier

__all__ = [
    "DFlashDrafter",
    "GenerationReport",
    "SamplingParams",
    "TargetFeedback",
    "TorchVerifier",
    "generate",
    "load_target",
]
