"""When requests arrive and how long they are: Poisson processes, arrival files, closed loop.

An :class:`Arrival` is one request: the time it reaches the server (seconds from the start of
the run), its prompt length and the number of tokens it will generate. Three sources:

- :func:`poisson_arrivals`: an open-loop Poisson process at ``rate_per_s`` requests per second
  (exponential gaps), lengths from the workload's distributions (:meth:`Workload.sample_lengths`);
- :func:`read_arrivals`: a recorded or hand-written schedule, one request per line;
- :func:`closed_loop`: every request present at time 0 (the closed-loop mode, where the serving
  loop admits them as slots free up).

Arrival files are plain text, UTF-8::

    # comments and blank lines are ignored; '#' starts a comment anywhere on a line
    arrival_s,prompt_len,output_len      <- optional header, first non-comment line only
    0.000, 812, 256
    0.125  97   1024                     <- commas or whitespace separate the three fields

``arrival_s`` is a finite number ≥ 0 and never smaller than the line before (the file is in
arrival order); ``prompt_len`` and ``output_len`` are whole numbers in 1 … 1 000 000. Every
problem raises :class:`~bastion.errors.ConfigError` whose message starts ``path:line:column:``
(1-based) for a problem inside the file, or ``path:`` for one with the file itself.

What this module does not do: serve the requests (the serving loop does) or time them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bastion.errors import ConfigError
from bastion.guard import public
from bastion.sim.workloads import Workload

__all__ = [
    "HEADER",
    "MAX_TOKENS",
    "Arrival",
    "closed_loop",
    "poisson_arrivals",
    "read_arrivals",
]

MAX_TOKENS = Workload.MAX_TOKENS  # longest accepted prompt or output (1 000 000 tokens)
HEADER = ("arrival_s", "prompt_len", "output_len")
_FORMAT = "one request per line: arrival_s prompt_len output_len (commas or whitespace between)"
_FIELD = re.compile(r"[^,\s]+")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _is_whole(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


@dataclass(frozen=True)
class Arrival:
    """One request: arrival time (s from the start), prompt and output lengths (tokens)."""

    time_s: float
    prompt_len: int
    output_len: int

    def __post_init__(self) -> None:
        bad = []
        if not (_is_real(self.time_s) and 0 <= self.time_s < math.inf):
            bad.append(f"time_s={self.time_s!r} (accepted: a finite number ≥ 0)")
        for name in ("prompt_len", "output_len"):
            value = getattr(self, name)
            if not (_is_whole(value) and 1 <= value <= MAX_TOKENS):
                bad.append(f"{name}={value!r} (accepted: a whole number in 1 … {MAX_TOKENS})")
        if bad:
            raise ConfigError(f"invalid arrival: {'; '.join(bad)}")


def _check_n(n: object, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ConfigError(f"{what} needs a whole number n ≥ 1 of requests; got {n!r}")
    return int(n)


def _with_lengths(times: np.ndarray, workload: Workload, rng: np.random.Generator) -> list[Arrival]:
    prompts, outputs = workload.sample_lengths(rng, times.size)
    return [
        Arrival(float(t), int(p), int(o)) for t, p, o in zip(times, prompts, outputs, strict=True)
    ]


@public(error=ConfigError, own=("n",))
def poisson_arrivals(
    rate_per_s: float, n: int, workload: Workload, rng: np.random.Generator
) -> list[Arrival]:
    """``n`` requests of a Poisson process at ``rate_per_s`` requests per second.

    The gaps (from t = 0 to the first arrival, and between arrivals) are exponential with mean
    1 / rate; they are drawn first, then the lengths (:meth:`Workload.sample_lengths`), so the
    same generator state gives the same arrivals.
    """
    if not (_is_real(rate_per_s) and 0 < rate_per_s < math.inf):
        raise ConfigError(f"arrival rate {rate_per_s!r} requests/s; accepted: a finite number > 0")
    count = _check_n(n, "poisson_arrivals")
    times = np.cumsum(rng.exponential(1.0 / float(rate_per_s), size=count))
    return _with_lengths(times, workload, rng)


@public(error=ConfigError, own=("n",))
def closed_loop(n: int, workload: Workload, rng: np.random.Generator) -> list[Arrival]:
    """``n`` requests all present at time 0 (closed loop), lengths from the workload."""
    return _with_lengths(np.zeros(_check_n(n, "closed_loop")), workload, rng)


def _position(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of byte ``offset`` of ``data``, whose bytes before
    ``offset`` are valid UTF-8."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    return data.count(b"\n", 0, offset) + 1, column


def _decode(path: Path) -> str:
    """The file's text, or a ConfigError naming why it cannot be read as UTF-8 text."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such arrivals file; expected {_FORMAT}") from None
    except IsADirectoryError:
        raise ConfigError(
            f"{path}: is a directory, not an arrivals file; expected {_FORMAT}"
        ) from None
    except (OSError, ValueError) as exc:  # permissions, a NUL in the path…
        raise ConfigError(f"{path}: cannot read the arrivals file ({exc})") from None
    nul = data.find(b"\x00")
    if nul >= 0:
        line, col = _position(data, nul)
        raise ConfigError(
            f"{path}:{line}:{col}: binary content (a NUL byte); an arrivals file is UTF-8 text"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = _position(data, exc.start)
        raise ConfigError(
            f"{path}:{line}:{col}: binary or non-UTF-8 content (byte 0x{data[exc.start]:02x}); "
            "an arrivals file is UTF-8 text"
        ) from None
    return text.removeprefix("\ufeff")  # a byte-order mark is not part of the first field


def _fields(where: str, line: str) -> list[tuple[int, str]]:
    """(1-based column, text) of each field of ``line``; at most one comma between two fields
    and none before the first or after the last (that would be an empty field)."""
    matches = list(_FIELD.finditer(line))
    gap_start = 0
    for i in range(len(matches) + 1):
        gap_end = matches[i].start() if i < len(matches) else len(line)
        commas = [gap_start + j for j, ch in enumerate(line[gap_start:gap_end]) if ch == ","]
        allowed = 1 if 0 < i < len(matches) else 0
        if len(commas) > allowed:
            col = commas[allowed] + 1
            raise ConfigError(f"{where}:{col}: empty field; expected {_FORMAT}")
        if i < len(matches):
            gap_start = matches[i].end()
    return [(m.start() + 1, m.group()) for m in matches]


def _show(text: str) -> str:
    """``text`` quoted for a message, shortened when it is long."""
    return repr(text if len(text) <= 40 else text[:30] + "…")


def _is_number(text: str) -> bool:
    """Whether Python reads ``text`` as a float (digit-group underscores not accepted)."""
    if "_" in text:
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


def _time(where: str, text: str) -> float:
    if not _is_number(text):
        raise ConfigError(
            f"{where}: arrival_s {_show(text)} is not a number; accepted: seconds ≥ 0 like 0.25"
        )
    value = float(text)
    if not math.isfinite(value):
        raise ConfigError(
            f"{where}: arrival_s {_show(text)} is not finite; accepted: a finite number ≥ 0"
        )
    if value < 0:
        raise ConfigError(f"{where}: arrival_s {_show(text)} is negative; accepted: seconds ≥ 0")
    return value


def _length(where: str, name: str, text: str) -> int:
    accepted = f"accepted: a whole number of tokens in 1 … {MAX_TOKENS}"
    if not _INTEGER.fullmatch(text):
        problem = "is not a whole number" if _is_number(text) else "is not a number"
        raise ConfigError(f"{where}: {name} {_show(text)} {problem}; {accepted}")
    # compare digit counts before int(): Python refuses to convert over 4300 digits
    huge = len(text.lstrip("+-").lstrip("0")) > len(str(MAX_TOKENS))
    value = 0 if huge else int(text)
    if text.startswith("-") or (value == 0 and not huge):
        raise ConfigError(f"{where}: {name} {text} is below 1; {accepted}")
    if huge or value > MAX_TOKENS:
        raise ConfigError(f"{where}: {name} {_show(text)} is absurdly large; {accepted}")
    return value


@public(error=ConfigError)
def read_arrivals(path: str | os.PathLike[str]) -> list[Arrival]:
    """Read and validate an arrivals file (format in the module docstring), in file order."""
    file = Path(path)
    text = _decode(file)
    arrivals: list[Arrival] = []
    header_allowed = True
    last_time, last_line = 0.0, 0
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r").split("#", 1)[0]
        fields = _fields(f"{file}:{number}", line)
        if not fields:
            continue
        if tuple(t.lower() for _, t in fields) == HEADER:
            if header_allowed:
                header_allowed = False
                continue
            raise ConfigError(
                f"{file}:{number}:{fields[0][0]}: a header line is accepted only before the "
                "first request"
            )
        header_allowed = False
        if len(fields) != len(HEADER):
            col = fields[3][0] if len(fields) > 3 else len(line.rstrip()) + 1
            raise ConfigError(
                f"{file}:{number}:{col}: {len(fields)} fields, expected 3; {_FORMAT} "
                f"(an optional header line, first, is exactly {','.join(HEADER)})"
            )
        (c_time, t_text), (c_prompt, p_text), (c_out, o_text) = fields
        time_s = _time(f"{file}:{number}:{c_time}", t_text)
        if time_s < last_time:
            raise ConfigError(
                f"{file}:{number}:{c_time}: arrival_s {t_text} is earlier than {last_time!r} on "
                f"line {last_line}; accepted: arrival times in non-decreasing order"
            )
        prompt = _length(f"{file}:{number}:{c_prompt}", "prompt_len", p_text)
        output = _length(f"{file}:{number}:{c_out}", "output_len", o_text)
        arrivals.append(Arrival(time_s, prompt, output))
        last_time, last_line = time_s, number
    if not arrivals:
        what = "is empty" if not text.strip() else "holds only comments, blank lines or a header"
        raise ConfigError(f"{file}: no requests: the file {what}; expected {_FORMAT}")
    return arrivals
