"""Output paths checked before any work starts: a file or directory that cannot be written is
refused with a :class:`~bastion.errors.ConfigError` naming it.

Its own module, below :mod:`bastion.guard` (whose ``writable_file`` rule uses it) and
:mod:`bastion.files` (which re-exports both functions): the checks are in the bodies, since the
guard cannot decorate what it imports.

What this module does not do: write anything (:mod:`bastion.files` does, atomically).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bastion.errors import ConfigError

__all__ = ["check_output_dir", "check_output_file"]


def _path_like(path: object, what: str) -> None:
    if not isinstance(path, str | os.PathLike) or "\x00" in str(path):
        raise ConfigError(
            f"{what} must be a file system path (str or os.PathLike); got {path!r:.80}"
        )


def _existing_ancestor(path: Path) -> Path:
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _probe_writable(base: Path, what: str, target: Path) -> None:
    """Create and remove a file in ``base``: permission bits say nothing for root or a
    read-only file system, a real attempt does."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".bastion-probe.", dir=base)
    except OSError as exc:
        raise ConfigError(
            f"{what} {target}: cannot write in {base} ({exc.strerror or exc})"
        ) from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)


def check_output_file(path: str | os.PathLike[str], what: str = "output") -> Path:
    """Refuse, with a :class:`ConfigError`, a file path that cannot be written: a directory,
    a path under a regular file, or one whose nearest existing folder is not writable. Missing
    parent folders are fine (the writers create them). Call it before the work starts."""
    _path_like(path, what)
    target = Path(path)
    if str(path) == "" or target.name in ("", ".", ".."):
        raise ConfigError(f"{what} {str(path)!r} is not a file name; give a file path")
    if target.is_dir():
        raise ConfigError(f"{what} {target} is a directory; give a file path")
    base = _existing_ancestor(target.parent)
    if not base.is_dir():
        raise ConfigError(f"{what} {target}: {base} is not a directory")
    _probe_writable(base, what, target)
    return target


def check_output_dir(path: str | os.PathLike[str], what: str = "output directory") -> Path:
    """Refuse, with a :class:`ConfigError`, a directory path that cannot be created or written
    (a regular file, a path under a regular file, an unwritable folder). Call it before the
    work starts."""
    _path_like(path, what)
    target = Path(path)
    if str(path) == "":
        raise ConfigError(f"{what} is empty; give a directory path")
    base = _existing_ancestor(target)
    if not base.is_dir():
        raise ConfigError(f"{what} {target}: {base} is not a directory")
    _probe_writable(base, what, target)
    return target
