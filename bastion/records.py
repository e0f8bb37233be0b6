"""The record vocabulary: every field any command or file reports, defined once.

Every command and file — ``bastion simulate --json`` and ``--out``, ``bastion experiment``
(``results.csv``, ``results.json``, ``requests.csv``), ``bastion generate --json``, ``bastion
demo --json`` — names its quantities from :data:`FIELDS`: one name, one unit, one meaning,
following the serving benchmarks (vLLM's and SGLang's): ``ttft_s``, ``tpot_s``, ``e2e_s``,
``tau`` (the mean accepted length, bonus token included), ``acceptance_rate``,
``acceptance_by_position``, ``throughput_tok_s``. Every record that names a policy carries its
display name (``policy``) and the full spec it was made from (``policy_spec``).
:func:`json_schema` is the JSON Schema of the commands' JSON output built from the vocabulary;
the package ships it as ``bastion/schemas/records.schema.json``. :data:`RENAMED` maps the names
of the previous release to these; :func:`upgrade` reads an old record with a
``DeprecationWarning``.

**Counting what a request received.** Both backends count a step by the tokens a user receives
from it. A step *commits* its accepted draft tokens and the bonus token; a request that reaches
its output length (or EOS, on the real backend) mid-step receives only the tokens still wanted,
and the rest are never delivered nor counted. For such a cut step, *delivered* = min(committed,
still wanted) enters τ (so the last step of a request may count fewer than it committed, and at
least 1), and its *accepted draft tokens* are min(accepted, delivered): the bonus token goes
first, then the deepest draft tokens.

What this module does not do: compute timings or decode; import torch.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from bastion.bestfirst import MAX_TREE_SIZE
from bastion.errors import ArgumentError
from bastion.guard import each, integer, public

__all__ = [
    "FIELDS",
    "RENAMED",
    "SCHEMA_FILE",
    "Field",
    "acceptance_stats",
    "delivered_counts",
    "json_safe",
    "json_schema",
    "shipped_schema",
    "upgrade",
]


@dataclass(frozen=True)
class Field:
    """One reported quantity."""

    unit: str  # "s", "tokens", "tokens/s", "1" (a ratio or count), "" (a label)
    kind: str  # JSON type: "number", "integer", "string", "boolean", "array", "object"
    meaning: str
    items: str | None = None  # an array's item type


_S, _N, _I, _T = "s", "number", "integer", "string"

#: Every field of every record and report, by name (times in seconds, sizes in tokens).
FIELDS: dict[str, Field] = {
    # -- what ran -------------------------------------------------------------------------------
    "experiment": Field("", _T, "the experiment's name (empty for `bastion simulate`)"),
    "model": Field("", _T, "bundled model name or config.json path"),
    "gpu": Field("", _T, "hardware profile name or .toml path"),
    "workload": Field("", _T, "workload name, workload file, or trace file / directory"),
    "truth": Field("", _T, "the simulated GPU's ground truth (name or .toml path)"),
    "temperature": Field("1", _N, "sampling temperature (0: greedy)"),
    "concurrency": Field("1", _I, "closed loop: clients; open loop: most requests in service"),
    "arrival_rate": Field("1/s", _N, "open loop: Poisson requests per second (null: closed loop)"),
    "arrivals": Field("", _T, "open loop: the arrivals file (null: none)"),
    "requests": Field("1", _I, "requests per policy"),
    "prefill_chunk": Field("tokens", _I, "prompt tokens prefilled per step (0: no prefill)"),
    "seed": Field("1", _I, "the run's seed"),
    "cost_mode": Field("", _T, "the controller's cost model: bare, static, ema, ema+calib, …"),
    "n_max": Field("tokens", _I, "the adaptive controller's cap on the tree size"),
    "drafter_config": Field(
        "", _T, "the drafter priced: a DFlash config.json path (null: the published layout)"
    ),
    "calibration_file": Field(
        "",
        _T,
        "the controller's calibration record file (null: calibrated on the simulated GPU)",
    ),
    "gpu_memory_utilization": Field(
        "1",
        _N,
        "the server's share of the GPU's memory (weights, activations, KV cache); null: memory "
        "does not limit the run",
    ),
    "tp": Field(
        "1",
        _I,
        "tensor parallelism: GPUs the model is split over (heads, FFN, vocabulary, KV cache), "
        "linked by the profile's interconnect",
    ),
    "slo_ttft_s": Field(_S, _N, "the TTFT service-level objective (null: none)"),
    "slo_tpot_s": Field(_S, _N, "the TPOT service-level objective (null: none)"),
    "batch_size": Field("1", _I, "real backend: most requests decoded together"),
    "policy": Field("", _T, "the policy's display name (ar: target-only autoregressive)"),
    "policy_spec": Field(
        "",
        _T,
        "the full spec the policy was made from (e.g. fixed:64, "
        "file.py:Name:ARGS); an object given directly: NAME [module:Class]",
    ),
    # -- per request ----------------------------------------------------------------------------
    "request_id": Field("1", _I, "the request's id in the run (its prompt's index)"),
    "arrival_s": Field(_S, _N, "when the request reached the server, from the run's start"),
    "first_token_s": Field(_S, _N, "when its first output token was produced"),
    "finish_s": Field(_S, _N, "when its last output token was produced"),
    "prompt_len": Field(
        "tokens",
        _I,
        "prompt tokens of a request (a run's spec: the override for every request; null: the "
        "workload's)",
    ),
    "output_len": Field(
        "tokens",
        _I,
        "output tokens of a request, the first included (a run's "
        "spec: the override for every request; null: the workload's)",
    ),
    "committed_tokens": Field(
        "tokens", _I, "tokens the decode steps delivered (output_len − 1 when finished)"
    ),
    "committed_per_step": Field(
        "tokens",
        "array",
        "per step: tokens delivered, bonus included "
        "(a step cut by the output length or EOS counts what it "
        "delivered)",
        _I,
    ),
    "accepted_per_step": Field(
        "tokens", "array", "per step: draft tokens among those delivered", _I
    ),
    "output_ids": Field("", "array", "the generated token ids (prompt excluded)", _I),
    "queue_s": Field(_S, _N, "real backend: wait for a free slot before the prefill"),
    "prefill_s": Field(_S, _N, "prefill time (simulator: prefill-only passes, summed)"),
    "stage_times": Field(_S, "object", "seconds per stage (draft, build, mask, verify, commit)"),
    "trees": Field(
        "", "array", "per step: the tree (size, parents, tokens, accepted_path)", "object"
    ),
    # -- latency (the serving benchmarks' definitions) -------------------------------------
    "ttft_s": Field(_S, _N, "time to first token: first token − arrival (queue and prefill)"),
    "tpot_s": Field(
        _S,
        _N,
        "time per output token after the first: (finish − first token) / "
        "(output_len − 1), 0 for one token; a run's: the mean over requests",
    ),
    "e2e_s": Field(_S, _N, "end-to-end latency: finish − arrival"),
    "ttft_mean_s": Field(_S, _N, "mean TTFT over requests"),
    "ttft_p50_s": Field(_S, _N, "median TTFT over requests"),
    "ttft_p99_s": Field(_S, _N, "99th-percentile TTFT over requests"),
    "tpot_p50_s": Field(
        _S, _N, "median TPOT over requests with output_len > 1 (real backend: of every timed run)"
    ),
    "tpot_p99_s": Field(
        _S, _N, "99th-percentile TPOT over requests with output_len > 1 (real: every timed run)"
    ),
    "tpot_min_s": Field(_S, _N, "real backend: the least tpot_s of the timed runs"),
    "tpot_max_s": Field(_S, _N, "real backend: the largest tpot_s of the timed runs"),
    "tpot_runs_s": Field(
        _S, "array", "real backend: every timed run's mean TPOT over its requests, in order", _N
    ),
    "e2e_mean_s": Field(_S, _N, "mean end-to-end latency over requests"),
    "e2e_p50_s": Field(_S, _N, "median end-to-end latency over requests"),
    "e2e_p99_s": Field(_S, _N, "99th-percentile end-to-end latency over requests"),
    # -- speculation ----------------------------------------------------------------------------
    "tau": Field(
        "tokens",
        _N,
        "τ, the mean accepted length: tokens delivered per step, bonus "
        "included; a run's: macro-averaged over requests",
    ),
    "acceptance_rate": Field(
        "1",
        _N,
        "accepted draft tokens / drafted nodes (root excluded), "
        "over steps with a draft; null without a draft (AR)",
    ),
    "acceptance_by_position": Field(
        "1", "array", "[d − 1]: share of drafting steps that accepted ≥ d draft tokens", _N
    ),
    "mean_tree_size": Field("tokens", _N, "tree nodes per step, root included"),
    "speedup": Field("1", _N, "AR's tpot_s / this tpot_s on the same requests"),
    # -- throughput and time --------------------------------------------------------------------
    "tokens": Field("tokens", _I, "output tokens generated over all requests"),
    "throughput_tok_s": Field(
        "tokens/s",
        _N,
        "output tokens per second (simulated, or wall with prefills on the real backend)",
    ),
    "steps": Field("1", _I, "decode steps (batched passes)"),
    "mean_batch": Field("1", _N, "requests per decode step"),
    "draft_s": Field(_S, _N, "seconds in drafter passes, summed over steps"),
    "prep_s": Field(_S, _N, "seconds of host preparation (trees, masks), summed over steps"),
    "verify_s": Field(_S, _N, "seconds in verification passes, summed over steps"),
    "simulated_s": Field(_S, _N, "simulated time of the policy's serving run"),
    "wall_s": Field(_S, _N, "wall time of its serving loop (machine-dependent)"),
    "cycle_predicted_s": Field(
        _S,
        _N,
        "the cost model's mean predicted cycle for the steps taken (null where none predicted)",
    ),
    "cycle_observed_s": Field(
        _S,
        _N,
        "the mean observed cycle of the same steps (simulated, or measured draft + build + verify)",
    ),
    # -- memory and SLOs (simulator) ------------------------------------------------------------
    "kv_capacity_tokens": Field(
        "tokens", _I, "tokens the paged KV cache holds (null: memory does not limit the run)"
    ),
    "kv_peak_tokens": Field(
        "tokens",
        _I,
        "the most KV token slots held at once (whole blocks, trees' slots during verification "
        "included)",
    ),
    "max_running": Field("1", _I, "the most requests admitted (prefilling or decoding) at once"),
    "preemptions": Field(
        "1", _I, "requests preempted for lack of KV blocks (their cache recomputed on readmission)"
    ),
    "queue_delay_p50_s": Field(
        _S, _N, "median time a request waited for admission (a preempted one's waits summed)"
    ),
    "queue_delay_p99_s": Field(_S, _N, "99th-percentile time a request waited for admission"),
    "slo_attainment": Field(
        "1", _N, "share of requests meeting every SLO given (null: no SLO given)"
    ),
    "goodput_rps": Field(
        "1/s", _N, "requests meeting every SLO given per simulated second (null: no SLO given)"
    ),
    "predicted_draft_s": Field(_S, _N, "the cost model's mean T_draft of the steps"),
    "measured_draft_s": Field(_S, _N, "the mean measured drafter pass of the steps"),
    "calib_rmse_bare_ms": Field(
        "ms",
        _N,
        "the bare roofline's RMSE on the calibration sweep (the simulated GPU's, or the "
        "calibration_file record's own)",
    ),
    "calib_rmse_ms": Field("ms", _N, "the calibrated cost model's RMSE on it"),
    # -- provenance -----------------------------------------------------------------------------
    "run_key": Field("", _T, "the run's cache key (empty outside an experiment)"),
    "bastion_version": Field("", _T, "the package version that computed the record"),
    # -- report-level keys ----------------------------------------------------------------------
    "records": Field("", "array", "the report's records", "object"),
    "spec": Field("", "object", "`bastion simulate`: the run's full spec"),
    "config": Field("", _T, "`bastion experiment`: the config it ran"),
    "identical": Field("", "boolean", "`bastion demo`: every output equals AR's"),
    "calibration": Field("", "object", "`bastion demo`: the cost model's calibration"),
    "cycle": Field(_S, "object", "`bastion generate`: predicted vs measured mean cycle parts"),
    "warmup": Field("1", _I, "`bastion generate`: untimed warm-up runs"),
    "repeats": Field(
        "",
        "object",
        "`bastion generate`: every timed run's wall_s, and the "
        "median, min and max of tpot_s and throughput_tok_s",
    ),
}

#: The previous release's names → the vocabulary's (readable for one release, with a warning).
RENAMED: dict[str, str] = {
    "time_to_first_token": "ttft_s",
    "time_per_output_token": "tpot_s",
    "acceptance_lengths": "committed_per_step",
    "num_input_tokens": "prompt_len",
    "num_output_tokens": "output_len",
    "cycle_measured_s": "cycle_observed_s",
}

SCHEMA_FILE = "schemas/records.schema.json"


@public
def upgrade(record: Mapping[str, Any], where: str = "a record") -> dict[str, Any]:
    """``record`` with the previous release's names renamed (a ``DeprecationWarning`` names
    them), and ``policy_spec`` filled from ``policy`` where it is missing."""
    out = dict(record)
    old = [k for k in record if k in RENAMED]
    for key in old:
        out.setdefault(RENAMED[key], out.pop(key))
    if old:
        pairs = ", ".join(f"{k} → {RENAMED[k]}" for k in old)
        warnings.warn(
            f"{where} uses the previous release's field names ({pairs}); they are read for one "
            "release more",
            DeprecationWarning,
            stacklevel=2,
        )
    if "policy" in out and "policy_spec" not in out:
        out["policy_spec"] = out["policy"]
    return out


def json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as null, recursively (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return value


def _type(kind: str, nullable: bool = True) -> dict[str, Any]:
    return {"type": [kind, "null"]} if nullable else {"type": kind}


def _property(f: Field) -> dict[str, Any]:
    prop: dict[str, Any] = {**_type(f.kind), "description": f"{f.meaning} [{f.unit or '-'}]"}
    if f.kind == "array" and f.items is not None:
        prop["items"] = _type(f.items)
    return prop


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every command's JSON output: an object whose keys
    and whose records' keys are all in :data:`FIELDS`, typed as the vocabulary says."""
    fields = {name: _property(f) for name, f in FIELDS.items()}
    record = {"type": "object", "properties": fields, "additionalProperties": False}
    top = dict(fields)
    top["records"] = {"type": "array", "items": {"$ref": "#/$defs/record"}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://bastion.invalid/schemas/records.schema.json",
        "title": "bastion records",
        "description": "The JSON output of bastion simulate, experiment, generate and demo "
        "(bastion.records).",
        "$defs": {"record": record},
        "type": "object",
        "required": ["records"],
        "properties": top,
        "additionalProperties": False,
    }


def shipped_schema() -> dict[str, Any]:
    """The schema file shipped in the package (the same as :func:`json_schema`)."""
    text = resources.files("bastion").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


@public
def delivered_counts(committed: int, wanted: int) -> tuple[int, int]:
    """(tokens delivered, draft tokens among them) of a step that committed ``committed``
    tokens (bonus included) for a request that still wants ``wanted`` (≥ 1)."""
    delivered = min(committed, wanted)
    return delivered, min(committed - 1, delivered)


@public(
    accepted=each(integer(lo=0)),
    sizes=each(integer(1, MAX_TREE_SIZE)),
    lengths=("accepted", "sizes"),
)
def acceptance_stats(accepted: Sequence[int], sizes: Sequence[int]) -> dict[str, Any]:
    """Draft acceptance over steps: ``accepted[i]`` draft tokens delivered by a step whose tree
    had ``sizes[i]`` nodes (root included).

    ``acceptance_rate`` = accepted draft tokens / drafted nodes (the root — the previous step's
    bonus token — not counted), over every step with a draft; ``acceptance_by_position[d − 1]``
    = the share of those steps that accepted at least d draft tokens (position 1's share is the
    first draft token's acceptance rate). NaN and ``()`` when nothing was drafted (AR).
    """
    acc = np.asarray(accepted, dtype=np.int64)
    n = np.asarray(sizes, dtype=np.int64)
    drafted = n > 1  # a tree of N nodes counts its root
    if acc.shape != n.shape or not drafted.any():
        return {"acceptance_rate": float("nan"), "acceptance_by_position": ()}
    hits = acc[drafted]
    if np.any(hits >= n[drafted]):
        i = int(np.flatnonzero(drafted)[np.flatnonzero(hits >= n[drafted])[0]])
        raise ArgumentError(
            f"acceptance_stats: step {i} accepted {int(acc[i])} draft tokens from a tree of "
            f"{int(n[i])} nodes (at most {int(n[i]) - 1})"
        )
    depth = int(hits.max())
    return {
        "acceptance_rate": float(hits.sum() / (n[drafted] - 1).sum()),
        "acceptance_by_position": tuple(float(np.mean(hits >= d)) for d in range(1, depth + 1)),
    }
