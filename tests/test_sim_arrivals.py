"""Open-loop pieces: Poisson arrivals, arrival files, length distributions, latency statistics."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest

from bastion.errors import ConfigError
from bastion.sim.arrivals import MAX_TOKENS, Arrival, closed_loop, poisson_arrivals, read_arrivals
from bastion.sim.latency import REQUEST_COLUMNS, RequestLatency, latency_summary, write_requests_csv
from bastion.sim.workloads import PRESETS, Workload, get_workload

FIXED = get_workload("math").with_(prompt_len_sigma=0.0, output_len_sigma=0.0)

# -- Poisson arrivals ---------------------------------------------------------------------------


def mean_gap_matches(times: list[float], rate: float) -> bool:
    """Is the mean gap 1/rate within 4 standard errors (exponential gaps: sd = mean)?"""
    gaps = np.diff([0.0, *times])
    return bool(abs(gaps.mean() - 1.0 / rate) <= 4.0 / rate / math.sqrt(gaps.size))


def test_poisson_mean_gap_is_one_over_the_rate() -> None:
    rate = 8.0
    arrivals = poisson_arrivals(rate, 4000, FIXED, np.random.default_rng(1))
    times = [a.time_s for a in arrivals]
    assert np.all(np.diff(times) >= 0) and times[0] > 0
    assert mean_gap_matches(times, rate)
    # negative controls: the same check rejects a rate 20 % off either way
    assert not mean_gap_matches(times, rate * 1.2)
    assert not mean_gap_matches(times, rate / 1.2)
    # exponential, not regular: the gaps' coefficient of variation is ≈ 1
    gaps = np.diff([0.0, *times])
    assert 0.9 < gaps.std() / gaps.mean() < 1.1


def test_same_seed_same_arrivals() -> None:
    w = get_workload("chat")
    a = poisson_arrivals(3.0, 50, w, np.random.default_rng([5, 1]))
    assert a == poisson_arrivals(3.0, 50, w, np.random.default_rng([5, 1]))
    assert a != poisson_arrivals(3.0, 50, w, np.random.default_rng([5, 2]))
    assert len({x.prompt_len for x in a}) > 10  # chat lengths are spread


def test_closed_loop_arrives_at_zero() -> None:
    arrivals = closed_loop(6, FIXED, np.random.default_rng(0))
    assert arrivals == [Arrival(0.0, FIXED.prompt_len, FIXED.output_len)] * 6


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan, True])
def test_bad_rate(rate: float) -> None:
    with pytest.raises(ConfigError, match="rate"):
        poisson_arrivals(rate, 3, FIXED, np.random.default_rng(0))


@pytest.mark.parametrize("n", [0, -3, 2.5])
def test_bad_request_count(n: int) -> None:
    with pytest.raises(ConfigError, match="whole number n"):
        poisson_arrivals(1.0, n, FIXED, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="whole number n"):
        closed_loop(n, FIXED, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("time_s", "prompt", "output", "field"),
    [
        (-1.0, 1, 1, "time_s"),
        (math.nan, 1, 1, "time_s"),
        (math.inf, 1, 1, "time_s"),
        (0.0, 0, 1, "prompt_len"),
        (0.0, 1, MAX_TOKENS + 1, "output_len"),
        (0.0, 2.0, 1, "prompt_len"),
    ],
)
def test_bad_arrival(time_s: float, prompt: int, output: int, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        Arrival(time_s, prompt, output)


# -- arrival files ------------------------------------------------------------------------------


def test_read_arrivals_accepts_commas_whitespace_comments_and_a_header(tmp_path: Path) -> None:
    path = tmp_path / "arrivals.csv"
    path.write_bytes(
        b"\xef\xbb\xbf# a recorded schedule\r\n"
        b"\n"
        b"arrival_s,prompt_len,output_len\r\n"
        b"0, 812, 256   # first\n"
        b"0.125 97\t1024\n"
        b"  0.125,5 ,7\n"
        b"1e1 +3 0004\n"
    )
    assert read_arrivals(path) == [
        Arrival(0.0, 812, 256),
        Arrival(0.125, 97, 1024),
        Arrival(0.125, 5, 7),
        Arrival(10.0, 3, 4),
    ]
    assert read_arrivals(str(path)) == read_arrivals(path)


BAD_LINES = [
    # (file content, line, column, phrase in the message)
    (b"0 1 2\n\x00\x01\x02binary\n", 2, 1, "binary"),
    (b"0 1 2\n0.5 \xff\xfe 3\n", 2, 5, "non-UTF-8"),
    (b"0 1\n", 1, 4, "2 fields, expected 3"),
    (b"# c\n0 1 2 3\n", 2, 7, "4 fields, expected 3"),
    (b"0,1,2\n1,,2\n", 2, 3, "empty field"),
    (b"0,1,2,\n", 1, 6, "empty field"),
    (b"abc 1 2\n", 1, 1, "arrival_s 'abc' is not a number"),
    (b"0 1 2\n1 x 2\n", 2, 3, "prompt_len 'x' is not a number"),
    (b"1_0 1 2\n", 1, 1, "is not a number"),
    (b"-0.5 1 2\n", 1, 1, "negative"),
    (b"nan 1 2\n", 1, 1, "not finite"),
    (b"0 1 2\ninf 1 2\n", 2, 1, "not finite"),
    (b"0 1.5 2\n", 1, 3, "prompt_len '1.5' is not a whole number"),
    (b"0 1 2e3\n", 1, 5, "output_len '2e3' is not a whole number"),
    (b"0 0 2\n", 1, 3, "prompt_len 0 is below 1"),
    (b"0 1 -2\n", 1, 5, "output_len -2 is below 1"),
    (b"0 1000001 2\n", 1, 3, "prompt_len '1000001' is absurdly large"),
    (b"0 1 " + b"9" * 5000 + b"\n", 1, 5, "output_len '9999"),
    (b"0 1 2\n3 1 2\n# x\n2.5 1 2\n", 4, 1, "earlier than 3.0 on line 2"),
    (b"0 1 2\narrival_s,prompt_len,output_len\n", 2, 1, "header line is accepted only before"),
]


@pytest.mark.parametrize(("content", "line", "column", "phrase"), BAD_LINES)
def test_bad_arrival_file_names_line_and_column(
    tmp_path: Path, content: bytes, line: int, column: int, phrase: str
) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(phrase)) as info:
        read_arrivals(path)
    assert str(info.value).startswith(f"{path}:{line}:{column}: ")


@pytest.mark.parametrize(
    ("content", "phrase"),
    [
        (None, "no such arrivals file"),
        ("dir", "is a directory"),
        (b"", "the file is empty"),
        (b" \n\n", "the file is empty"),
        (b"# only\narrival_s prompt_len output_len\n", "only comments, blank lines or a header"),
    ],
)
def test_bad_arrival_file_names_the_file(
    tmp_path: Path, content: bytes | str | None, phrase: str
) -> None:
    path = tmp_path / "arrivals.txt"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(phrase)) as info:
        read_arrivals(path)
    assert str(info.value).startswith(f"{path}: ")


# -- length distributions -----------------------------------------------------------------------


def test_sigma_zero_gives_the_fixed_lengths() -> None:
    prompts, outputs = FIXED.sample_lengths(np.random.default_rng(0), 100)
    assert prompts.dtype == np.int64 and outputs.dtype == np.int64
    assert set(prompts.tolist()) == {FIXED.prompt_len}
    assert set(outputs.tolist()) == {FIXED.output_len}
    default = Workload("w", top1=0.9, decay=0.98, concentration=0.5, alignment=0.9)
    assert default.prompt_len_sigma == default.output_len_sigma == 0.0  # unchanged by default


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_lengths_are_clipped_and_centred_on_the_median(name: str) -> None:
    w = PRESETS[name]
    if w.name != "llama-3.1-8b-long":  # the paper presets' medians are the old fixed lengths
        assert (w.prompt_len, w.output_len, w.output_len_max) == (256, 512, 8192)
    prompts, outputs = w.sample_lengths(np.random.default_rng(3), 20_000)
    for lengths, median, high in (
        (prompts, w.prompt_len, w.prompt_len_max),
        (outputs, w.output_len, w.output_len_max),
    ):
        assert lengths.min() >= 1 and lengths.max() <= high
        assert abs(np.median(lengths) / median - 1) < 0.05
        assert np.unique(lengths).size > 50


def test_chat_spreads_more_than_math_and_the_clip_binds() -> None:
    math_w, chat = PRESETS["math"], PRESETS["chat"]
    assert chat.prompt_len_sigma > math_w.prompt_len_sigma
    wide = math_w.with_(prompt_len_sigma=5.0, output_len_sigma=5.0)
    prompts, outputs = wide.sample_lengths(np.random.default_rng(0), 2000)
    assert prompts.max() == wide.prompt_len_max and outputs.max() == wide.output_len_max
    assert prompts.min() == 1 and outputs.min() == 1


def test_output_lengths_do_not_depend_on_the_prompt_sigma() -> None:
    a = FIXED.sample_lengths(np.random.default_rng(9), 50)[1]
    b = FIXED.with_(prompt_len_sigma=1.0).sample_lengths(np.random.default_rng(9), 50)[1]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"prompt_len_sigma": -0.1}, "prompt_len_sigma"),
        ({"output_len_sigma": math.nan}, "output_len_sigma"),
        ({"output_len_sigma": math.inf}, "output_len_sigma"),
        ({"prompt_len_max": 100}, "prompt_len_max"),  # below the median (256)
        ({"output_len_max": MAX_TOKENS + 1}, "output_len_max"),
        ({"output_len": 20_000}, "output_len_max"),  # the preset's clip is 8192
        ({"prompt_len": MAX_TOKENS + 1}, "prompt_len"),
        ({"prompt_len_max": 300.0}, "prompt_len_max"),
    ],
)
def test_bad_length_distribution(changes: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}=.*\(accepted: "):
        get_workload("math").with_(**changes)


def test_bad_sample_count() -> None:
    with pytest.raises(ConfigError, match="whole number n"):
        FIXED.sample_lengths(np.random.default_rng(0), -1)


# -- latency statistics -------------------------------------------------------------------------


def latency(i: int, arrival: float, first: float, finish: float, out: int) -> RequestLatency:
    return RequestLatency(i, arrival, first, finish, 100, out, max(out - 1, 0), max(out - 1, 0))


def test_request_latency_properties() -> None:
    r = latency(0, 1.0, 1.5, 3.5, 5)
    assert (r.ttft_s, r.tpot_s, r.e2e_s) == (0.5, 0.5, 2.5)
    assert latency(1, 1.0, 1.5, 1.5, 1).tpot_s == 0.0


def test_latency_summary_percentiles() -> None:
    rows = [latency(i, float(i), i + 0.1 * i, i + 0.1 * i + 10.0, 11) for i in range(101)]
    rows.append(latency(101, 0.0, 0.2, 0.2, 1))  # one output token: no TPOT
    s = latency_summary(rows)
    assert set(s) == {"ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"} | {
        "e2e_p50_s",
        "e2e_p99_s",
    }
    ttft = [r.ttft_s for r in rows]
    assert s["ttft_p50_s"] == pytest.approx(np.percentile(ttft, 50))
    assert s["ttft_p99_s"] == pytest.approx(np.percentile(ttft, 99))
    assert s["tpot_p50_s"] == pytest.approx(1.0) and s["tpot_p99_s"] == pytest.approx(1.0)
    assert s["e2e_p99_s"] == pytest.approx(np.percentile([r.e2e_s for r in rows], 99))
    with pytest.raises(ConfigError, match="at least one"):
        latency_summary([])


@pytest.mark.parametrize(
    "args", [(0, 2.0, 1.0, 3.0, 2), (0, 0.0, 2.0, 1.0, 2), (0, 0.0, math.nan, 1.0, 2)]
)
def test_bad_request_latency(args: tuple[int, float, float, float, int]) -> None:
    with pytest.raises(ConfigError, match="request 0"):
        latency(*args)


def test_requests_csv_is_one_row_per_request(tmp_path: Path) -> None:
    rows = [latency(i, 0.1 * i, 0.1 * i + 0.3, 0.1 * i + 1.3, 21) for i in range(4)]
    path = tmp_path / "out" / "requests.csv"
    write_requests_csv(path, rows)
    with path.open(newline="") as f:
        read = list(csv.DictReader(f))
    assert tuple(read[0]) == REQUEST_COLUMNS and len(read) == 4
    for row, r in zip(read, rows, strict=True):
        assert int(row["request_id"]) == r.request_id
        assert float(row["tpot_s"]) == r.tpot_s and float(row["ttft_s"]) == r.ttft_s
    assert [p.name for p in path.parent.iterdir()] == ["requests.csv"]  # no temporary left
    write_requests_csv(path, [])
    assert path.read_text() == ",".join(REQUEST_COLUMNS) + "\n"
