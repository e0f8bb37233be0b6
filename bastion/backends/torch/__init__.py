"""The real backend: Hugging Face causal-LM targets and DFlash drafters under the shared engine.

- :mod:`.sampling`      the target's processed distribution (temperature, top-k, top-p), sampling
- :mod:`.verifier`      batched tree verification: padded trees, 4D mask, one forward pass,
                        per-request acceptance and KV compaction in a batched cache
- :mod:`.dflash_format` the DFlash checkpoint format: config layouts, key names, read/write
- :mod:`.drafter`       the DFlash block-diffusion drafter, every request of a step in one pass
- :mod:`.clock`         the device-synchronised wall clock
- :mod:`.timing`        the timing hooks (timers of real passes), the real-run cost models
- :mod:`.calibrate`     calibration records of the target (roofline) and the drafter (T_draft)
- :mod:`.prepare`       loading the target; a session's set-up: checks, verifier, cost model
- :mod:`.decode`        the decode loop: continuous batching over :meth:`SpecEngine.step`
- :mod:`.reports`       the reports of a run and the traces recorded from it
- :mod:`.runner`        ``generate_batch`` and ``generate``: set-up, warm-ups, timed runs, report
- :mod:`.hf`            ``speculative_generate``: a drop-in for ``model.generate``

Importing this package imports torch and transformers. What it does not do: hybrid/recurrent
caches (they cannot be cropped) or batched prefill (each prompt is prefilled alone).
"""

from __future__ import annotations

from bastion.backends.torch.drafter import DFlashDrafter
from bastion.backends.torch.hf import SpeculativeGenerateOutput, speculative_generate
from bastion.backends.torch.prepare import load_target
from bastion.backends.torch.reports import BatchGenerationReport, GenerationReport
from bastion.backends.torch.runner import generate, generate_batch
from bastion.backends.torch.sampling import SamplingParams
from bastion.backends.torch.verifier import TargetFeedback, TorchVerifier

__all__ = [
    "BatchGenerationReport",
    "DFlashDrafter",
    "GenerationReport",
    "SamplingParams",
    "SpeculativeGenerateOutput",
    "TargetFeedback",
    "TorchVerifier",
    "generate",
    "generate_batch",
    "load_target",
    "speculative_generate",
]
