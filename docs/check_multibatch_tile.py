"""Why adaptive trails the best fixed tree at small C in the multi-batch experiment.

Serves the multi-batch experiment's setting (qwen3-8b on a simulated rtx-a6000, ``code``
workload, 256 output tokens, 2·C requests, at least 8) with fixed:16/32/64 and ``bastion``, once
with the controller's cost model calibrated as ``bastion simulate`` does (the fit chooses the
GEMM tile term among 0, 64 and 128 tokens by its in-sample error) and once with the tile term
fixed at 64 tokens, the simulated GPU's own tile. Prints adaptive / best fixed throughput per C.

Run: ``python docs/check_multibatch_tile.py``. Deterministic (seeded); a few seconds.
"""

from __future__ import annotations

from bastion.cost.calibration import calibrate, profile_sweep
from bastion.cost.costmodel import RooflineCostModel
from bastion.cost.hardware import get_profile
from bastion.cost.models import DrafterSpec, get_model
from bastion.policies import make_policy
from bastion.sim.gpu import SimulatedGPU
from bastion.sim.serving import serve
from bastion.sim.synthetic import SyntheticSource
from bastion.sim.workloads import get_workload


def main() -> None:
    model = get_model("qwen3-8b")
    hw = get_profile("rtx-a6000")
    drafter = DrafterSpec.dflash_for(model)
    workload = get_workload("code").with_(output_len=256, output_len_sigma=0.0)
    print("| tile candidates | tile chosen | C | bastion / best fixed |")
    print("|---|---:|---:|---:|")
    for tiles in ((0, 64, 128), (64,)):
        probe = SimulatedGPU(hw, model, drafter, seed=7919)
        points = profile_sweep(lambda s, c, g=probe: g.verify_s([s], [c]), repeats=3, warmup=0)
        record = calibrate(model, hw, points, backend="sim", tile_candidates=tiles)
        cost_model = RooflineCostModel(
            hw, model, drafter, calibration=record, prep_s=probe.prep_truth([64])
        )
        for c in (1, 4, 8, 16):
            tput = {}
            for name in ("fixed:16", "fixed:32", "fixed:64", "bastion"):
                cm = cost_model if name == "bastion" else None
                gpu = SimulatedGPU(hw, model, drafter)
                source = SyntheticSource(workload, 0)
                tput[name] = serve(make_policy(name), gpu, source, max(2 * c, 8), c, cm).throughput
            best = max(v for k, v in tput.items() if k.startswith("fixed"))
            tile = record.calibration.tile_tokens
            print(f"| {tiles} | {tile} | {c} | {tput['bastion'] / best:.3f} |")


if __name__ == "__main__":
    main()
