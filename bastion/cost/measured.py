"""Measured per-operator GPU timings: the two CSV layouts, what each column measures, the reader.

Two public per-operator CSV layouts are read, one row per token count, milliseconds, 16-bit
weights, tensor parallel 1:

- ``vidur`` (Vidur's profiling data, e.g. ``docs/data/a100-80gb_llama-3-8b_per-layer-ops.csv``):
  per-layer ``qkv_proj_ms``, ``o_proj_ms``, ``gate_up_proj_ms``, ``down_proj_ms``, ``act_ms``,
  ``rope_ms``, ``input_norm_ms``, ``post_attn_norm_ms``, ``residual_add_ms`` (one of a layer's
  two adds) and per-pass ``embedding_ms``;
- ``llmservingsim`` (LLMServingSim's profiler): per-layer ``qkv_proj_ms``, ``o_proj_ms``,
  ``gate_up_proj_ms``, ``down_proj_ms``, ``act_fn_ms``, ``rotary_emb_ms``, ``layernorm_ms``
  (one fused add + RMSNorm kernel) and per-pass ``embedding_ms``, ``final_layernorm_ms``,
  ``lm_head_ms``.

Both use vLLM-style kernels (fused q/k/v and gate/up, fused SiLU·mul, gathered embedding rows).
Empty cells are allowed (a column measured over fewer token counts); any other unreadable cell
raises :class:`MeasuredDataError` naming the file, row and column. Every column is either mapped
to roofline operators or reported as unmapped.

What this module does not do: fit or score anything (:mod:`bastion.cost.columnfit`,
:mod:`bastion.cost.validation`).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from bastion.cost.opcounts import RooflineOptions
from bastion.errors import ConfigError
from bastion.guard import public

__all__ = [
    "FORMATS",
    "MEASURED_OPTIONS",
    "ColumnSpec",
    "MeasuredDataError",
    "MeasuredFormat",
    "MeasuredTable",
    "load_measured",
]

Array = npt.NDArray[np.float64]
MeasuredFormat = Literal["vidur", "llmservingsim"]


class MeasuredDataError(ConfigError):
    """A measured-timings CSV that cannot be read: the message names file, row and column."""


@dataclass(frozen=True)
class ColumnSpec:
    """What one CSV column measures: roofline operators × shares, per layer or per pass."""

    parts: tuple[tuple[str, float], ...]  # (operator, share of it one cell covers)
    per_pass: bool = False  # once per pass (embedding, LM head) rather than per layer
    note: str = ""
    count: float = 1.0  # kernels of this column in one layer (per pass: in the pass)


_LAYER_GEMMS: dict[str, ColumnSpec] = {
    "qkv_proj_ms": ColumnSpec((("qkv_proj", 1.0),), note="fused q/k/v projection"),
    "o_proj_ms": ColumnSpec((("o_proj", 1.0),)),
    "gate_up_proj_ms": ColumnSpec((("gate_up_proj", 1.0),), note="fused gate+up projection"),
    "down_proj_ms": ColumnSpec((("down_proj", 1.0),)),
}

#: Column → what it measures, per format.
FORMATS: dict[str, dict[str, ColumnSpec]] = {
    "vidur": {
        **_LAYER_GEMMS,
        "act_ms": ColumnSpec((("act", 1.0),), note="SiLU·mul"),
        "rope_ms": ColumnSpec((("rope", 1.0),)),
        "input_norm_ms": ColumnSpec((("input_norm", 1.0),)),
        "post_attn_norm_ms": ColumnSpec((("post_attn_norm", 1.0),)),
        "residual_add_ms": ColumnSpec(
            (("residual_add", 0.5),), note="one of a layer's two adds", count=2.0
        ),
        "embedding_ms": ColumnSpec((("embedding", 1.0),), per_pass=True),
    },
    "llmservingsim": {
        **_LAYER_GEMMS,
        "act_fn_ms": ColumnSpec((("act", 1.0),), note="SiLU·mul"),
        "rotary_emb_ms": ColumnSpec((("rope", 1.0),)),
        "layernorm_ms": ColumnSpec(
            (("input_norm", 1.0), ("residual_add", 0.5)),
            note="one fused add + RMSNorm kernel",
            count=2.0,
        ),
        "embedding_ms": ColumnSpec((("embedding", 1.0),), per_pass=True),
        "final_layernorm_ms": ColumnSpec((("final_norm", 1.0),), per_pass=True),
        "lm_head_ms": ColumnSpec((("lm_head", 1.0),), per_pass=True),
    },
}
#: The measured kernels' implementation choices (vLLM).
MEASURED_OPTIONS = RooflineOptions(fused_qkv=True, fused_gate_up=True, full_embedding_table=False)


@dataclass(frozen=True)
class MeasuredTable:
    """A measured CSV: token counts, one array of seconds per mapped column (NaN: empty)."""

    path: str
    format: str
    tokens: Array
    columns: dict[str, Array]  # mapped column → seconds (NaN where the cell was empty)
    unmapped: tuple[str, ...]  # columns present in the file that no operator maps to


def _cell(text: str | None, path: str, row: int, column: str, what: str) -> float:
    if text is None:
        raise MeasuredDataError(
            f"{path}, row {row}, column {column!r}: missing cell (the row has fewer values than "
            "the header); accepted: one value per header column, empty for not measured"
        )
    try:
        value = float(text)
    except ValueError:
        raise MeasuredDataError(
            f"{path}, row {row}, column {column!r}: {text!r} is not a number; accepted: {what}"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise MeasuredDataError(
            f"{path}, row {row}, column {column!r}: {text!r} is out of range; accepted: {what}"
        )
    return value


@public
def load_measured(path: str | os.PathLike[str], format: str = "vidur") -> MeasuredTable:
    """Read a per-operator CSV in ``format`` (``vidur`` or ``llmservingsim``).

    Rows are numbered as lines of the file (the header is row 1).
    """
    if format not in FORMATS:
        raise ConfigError(f"measured format {format!r}; accepted: {', '.join(FORMATS)}")
    spec = FORMATS[format]
    name = os.fspath(path)
    try:
        with open(name, newline="", encoding="utf-8-sig") as fh:  # a byte-order mark is fine
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = list(reader)
    except FileNotFoundError:
        raise MeasuredDataError(f"measured data not found: {name}") from None
    except IsADirectoryError:
        raise MeasuredDataError(f"measured data {name} is a directory; give a CSV file") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise MeasuredDataError(f"{name}: not a readable CSV ({exc})") from None
    except OSError as exc:
        raise MeasuredDataError(f"measured data {name} cannot be read ({exc})") from None
    if "num_tokens" not in header:
        raise MeasuredDataError(
            f"{name}, row 1: no 'num_tokens' column (header: {', '.join(header) or 'empty'}); "
            f"accepted {format} columns: num_tokens, {', '.join(spec)}"
        )
    if not rows:
        raise MeasuredDataError(f"{name}: no data rows after the header")
    mapped = [c for c in header if c in spec]
    unmapped = tuple(c for c in header if c != "num_tokens" and c not in spec)
    if not mapped:
        raise MeasuredDataError(
            f"{name}, row 1: no column of the {format} format; accepted: {', '.join(spec)}"
        )
    tokens = np.empty(len(rows))
    columns = {c: np.full(len(rows), np.nan) for c in mapped}
    seen: dict[float, int] = {}
    for i, row in enumerate(rows):
        line = i + 2
        if None in row:  # more values than header columns
            raise MeasuredDataError(
                f"{name}, row {line}: {len(header) + len(row[None])} values for "
                f"{len(header)} header columns; accepted: one value per header column"
            )
        t = _cell(row["num_tokens"], name, line, "num_tokens", "a positive whole number")
        if t != int(t):
            raise MeasuredDataError(
                f"{name}, row {line}, column 'num_tokens': {row['num_tokens']!r} is not a whole "
                "number; accepted: a positive whole number"
            )
        if t in seen:
            raise MeasuredDataError(
                f"{name}, row {line}, column 'num_tokens': {int(t)} repeats row {seen[t]}; "
                "accepted: one row per token count"
            )
        seen[t] = line
        tokens[i] = t
        for c in mapped:
            text = row[c]
            if text is not None and not text.strip():
                continue  # empty: not measured at this token count
            columns[c][i] = 1e-3 * _cell(
                text, name, line, c, "a positive number of milliseconds or an empty cell"
            )
    order = np.argsort(tokens)
    return MeasuredTable(
        path=name,
        format=format,
        tokens=tokens[order],
        columns={c: v[order] for c, v in columns.items()},
        unmapped=unmapped,
    )


def bundled_measured() -> Mapping[str, Path]:
    """Measured tables shipped in the checkout's ``docs/data`` (empty in a wheel)."""
    root = Path(__file__).resolve().parents[2] / "docs" / "data"
    return {p.stem: p for p in sorted(root.glob("*.csv"))} if root.is_dir() else {}
