"""Atomic file writes: calibration records, probed profiles, results, reports, figures.

A file is written to a temporary sibling and renamed into place with ``os.replace``: readers see
the old file or the new one, never half of one, and a failed write leaves nothing behind. The
file gets the user's umask (``mkstemp`` alone would leave it readable by its owner only). A
directory (a trained model) is built as a temporary sibling directory and renamed into place
the same way (:func:`atomic_directory`). :func:`check_output_file` and
:func:`check_output_dir` refuse a path that cannot be written *before* any work starts.

Leftovers: a process killed with ``kill -9`` mid-write cannot remove its temporary sibling. Every
temporary name carries :data:`TEMP_MARK`, this host's name and the writer's process id
(``.results.csv.bastion-tmp.HOST.PID.XXXXXXXX``), so the next write into the same directory —
the next run of a sweep, say — removes the ones whose writer is no longer running
(:func:`remove_leftovers`, once per directory and process). A temporary file of a live writer,
or of another host sharing the directory, is never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bastion.errors import ArgumentError, ConfigError
from bastion.guard import has, public, writable_file
from bastion.paths import check_output_dir, check_output_file

__all__ = [
    "atomic_directory",
    "check_output_dir",
    "check_output_file",
    "config_kind",
    "read_json_file",
    "read_text_file",
    "read_toml_file",
    "remove_leftovers",
    "save_figure_atomic",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


#: Largest configuration or data file read whole (bytes); a larger one is refused, not read.
MAX_READ_BYTES = 256 << 20

#: In the name of every temporary file or directory an atomic write makes (and only there).
TEMP_MARK = ".bastion-tmp."
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
_LEFTOVER = re.compile(r"\.bastion-tmp\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>[0-9]+)\.")
_swept: set[str] = set()  # directories this process has already cleaned


def temp_prefix(name: str) -> str:
    """The prefix of a temporary sibling of ``name`` made by this process."""
    return f".{name}{TEMP_MARK}{_HOST}.{os.getpid()}."


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process; a pid beyond the OS's
        return True
    return True


@public
def remove_leftovers(directory: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files and directories in ``directory`` left by atomic writes whose
    process (on this host) is no longer running; returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:  # missing or unreadable: nothing to clean
        return removed
    for entry in entries:
        found = _LEFTOVER.search(entry.name)
        if found is None or found["host"] != _HOST or _running(int(found["pid"])):
            continue
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _sweep_once(directory: Path) -> None:
    key = os.fspath(directory)
    if key not in _swept:
        _swept.add(key)
        remove_leftovers(directory)


@public
def read_text_file(
    path: str | os.PathLike[str], what: str = "file", max_bytes: int = MAX_READ_BYTES
) -> str:
    """The UTF-8 text of ``path``; a missing file, a directory, an unreadable, oversized or
    binary file is a :class:`ConfigError` naming the file."""
    p = Path(path)
    if "\x00" in str(p):  # the OS refuses such a name (a ValueError from os.stat)
        raise ConfigError(f"{what} {str(p)!r} is not a file name: it holds a NUL character")
    try:
        if p.is_dir():
            raise ConfigError(f"{what} {p} is a directory; give a file")
        size = p.stat().st_size
        if size > max_bytes:
            raise ConfigError(f"{what} {p} is {size} bytes; at most {max_bytes} are read")
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {p}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} {p} is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{what} {p} cannot be read ({exc.strerror or exc})") from None


@public
def read_json_file(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """The parsed JSON of ``path`` (see :func:`read_text_file`); invalid or too deeply nested
    JSON is a :class:`ConfigError` naming the file."""
    text = read_text_file(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} is nested too deeply to be a valid file") from None


@public
def read_toml_file(path: str | os.PathLike[str], what: str = "TOML file") -> dict[str, Any]:
    """The parsed TOML of ``path`` (see :func:`read_text_file`); invalid or too deeply nested
    TOML is a :class:`ConfigError` naming the file."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib

    text = read_text_file(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} is nested too deeply to be a valid file") from None


#: The kinds of configuration file a directory may hold, for the ``kind`` key.
CONFIG_KINDS = ("hardware-profile", "workload")


def config_kind(data: Mapping[str, Any], origin: str) -> str:
    """What a parsed configuration file is: its ``kind`` key when it has one (one of
    :data:`CONFIG_KINDS`), else by shape — a hardware profile has a ``[peak]`` table, a
    workload has none. Lets one directory hold both (``$BASTION_HWPROFILES`` and
    ``$BASTION_WORKLOADS`` naming the same one). Checked in its body (the guard imports this
    module)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin!s:.200}: a configuration must be a table; got {data!r:.80}")
    kind = data.get("kind")
    if kind is None:
        return "hardware-profile" if isinstance(data.get("peak"), dict) else "workload"
    if kind not in CONFIG_KINDS:
        raise ConfigError(
            f"{origin}: key 'kind' is {kind!r}; accepted: {', '.join(map(repr, CONFIG_KINDS))}"
        )
    return str(kind)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomic(path: str | os.PathLike[str], write: Any) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_once(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target.name), dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@public(path=writable_file)
def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary sibling, fsync, ``os.replace``)."""
    data = text.encode("utf-8")
    _write_atomic(path, lambda f: f.write(data))


@public(path=writable_file)
def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary sibling, fsync, ``os.replace``)."""
    _write_atomic(path, lambda f: f.write(data))


@public(fig=has("savefig"), path=writable_file)
def save_figure_atomic(fig: Any, path: str | os.PathLike[str], **savefig_kwargs: Any) -> None:
    """``fig.savefig(path, **savefig_kwargs)`` atomically: a killed plot leaves the old file or
    none, never a truncated one. The format comes from ``path``'s suffix unless ``format=`` is
    given (the temporary sibling's name would not tell matplotlib)."""
    target = Path(path)
    kwargs = dict(savefig_kwargs)
    if "format" not in kwargs and target.suffix:
        kwargs["format"] = target.suffix.lstrip(".")
    _write_atomic(target, lambda f: fig.savefig(f, **kwargs))


@public
@contextmanager
def atomic_directory(path: str | os.PathLike[str], *, replace: bool = False) -> Iterator[Path]:
    """Build a directory atomically: yields a temporary sibling to fill; on success it is
    renamed to ``path``, on any error it is removed and ``path`` is left as it was.

    ``path`` must be absent or an empty directory unless ``replace`` is true, in which case an
    existing directory is swapped out (moved aside, then removed) only after the new one is
    complete."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not replace:
        raise ConfigError(f"{target} is not empty; give a new or empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_once(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(target.name), dir=target.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        old = None
        if target.is_dir():
            old = Path(
                tempfile.mkdtemp(prefix=temp_prefix(target.name + ".old"), dir=target.parent)
            )
            os.replace(target, old / "d")
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@public(path=writable_file)
def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    try:
        text = json.dumps(data, indent=2, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ArgumentError(f"write_json_atomic: data must be JSON-serialisable: {exc}") from None
    write_text_atomic(path, text + "\n")


def checked_table(
    origin: str, name: str, table: object, accepted: Collection[str]
) -> Mapping[str, Any]:
    """A ``[name]`` table of a config file that may hold only ``accepted`` keys; anything else is
    a :class:`ConfigError` naming the file, the table and the accepted keys."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{origin}: [{name}] must be a table")
    unknown = sorted(set(table) - set(accepted))
    if unknown:
        raise ConfigError(
            f"{origin}: unknown key(s) in [{name}]: {', '.join(unknown)}; accepted: "
            f"{', '.join(accepted)}"
        )
    return table
