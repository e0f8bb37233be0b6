"""The training corpus: the running Python's standard-library ``.py`` sources, offline.

Files are found through ``sysconfig`` (``site-packages`` and test suites excluded) and split
*by file* into training text and held-out text with a hash of the file's path relative to the
library root, so the split is deterministic and the same file always lands on the same side.
A byte-level BPE tokenizer (``tokenizers``) is trained on the training split; it has the special
tokens ``<|endoftext|>`` (document separator and EOS), ``<|pad|>`` and ``<|mask|>`` (the DFlash
drafter's mask token).

What this module does not do: import torch, or train models (see :mod:`bastion.demo.train`).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.errors import ConfigError
from bastion.guard import integer, public, readable_file

__all__ = [
    "SPECIALS",
    "Corpus",
    "calibration_prompts",
    "heldout_prompts",
    "load_corpus",
    "train_tokenizer",
]

SPECIALS = ("<|endoftext|>", "<|pad|>", "<|mask|>")
HELDOUT_PERCENT = 5  # files whose path hash falls below this percentile are held out


@dataclass(frozen=True)
class Corpus:
    root: Path
    train: tuple[Path, ...]
    heldout: tuple[Path, ...]

    @staticmethod
    @public(error=ConfigError, path=readable_file)
    def read(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"{path} cannot be read: {exc.strerror or exc}") from None

    def texts(self, split: str) -> Iterator[str]:
        for path in self.train if split == "train" else self.heldout:
            yield self.read(path)


def _is_heldout(rel: str) -> bool:
    digest = hashlib.sha256(rel.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


@public
def load_corpus(root: Path | None = None) -> Corpus:
    """The standard library's sources under ``root`` (default: this Python's), split by file.
    ``root`` must be a standard library's directory (the one holding ``os.py``): any other
    directory, ``/`` say, is refused before it is walked."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    if not (base / "os.py").is_file():
        raise ConfigError(
            f"{base} is not a Python standard library directory (it holds no os.py); pass the "
            "directory of the standard library's sources"
        )
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    try:
        files = sorted(
            p for p in base.rglob("*.py") if not skip.intersection(p.relative_to(base).parts)
        )
    except OSError as err:  # a directory unreadable or gone while walking
        raise ConfigError(f"cannot read the sources under {base}: {err}") from err
    if not files:
        raise ConfigError(f"no .py files under {base}; pass the standard library's directory")
    train: list[Path] = []
    held: list[Path] = []
    for p in files:
        (held if _is_heldout(p.relative_to(base).as_posix()) else train).append(p)
    return Corpus(base, tuple(train), tuple(held))


@public
def heldout_prompts(corpus: Corpus, n: int = 8, chars: int = 300) -> list[str]:
    """About ``chars`` characters of code (from the first top-level ``def``/``class``, cut at a
    line end) of the first ``n`` held-out files that have one: code the models never saw."""
    prompts = []
    for path in corpus.heldout:
        text = corpus.read(path)
        starts = [text.find(f"\n{kw} ") for kw in ("def", "class")]
        start = min((s + 1 for s in starts if s >= 0), default=-1)
        if start < 0 or len(text) - start < 2 * chars:
            continue
        cut = text.rfind("\n", start, start + chars)
        prompts.append(text[start : cut + 1 if cut > start else start + chars])
        if len(prompts) == n:
            break
    return prompts


@public(n=integer(1, 1000), every=integer(1, 100_000))
def calibration_prompts(
    corpus: Corpus, n: int = 8, every: int = 61, exclude: Sequence[str] = ()
) -> list[str]:
    """Prompts for timing the machine (``bastion twin``, ``bastion truth measure``), cut as
    :func:`heldout_prompts` cuts them from every ``every``-th *training* file, leaving out any
    text in ``exclude`` (the held-out prompts; identical files exist on both sides, such as the
    charmap codecs): disjoint from the prompts whose runs they predict."""
    picked = Corpus(corpus.root, (), corpus.train[::every])
    banned = set(exclude)
    out = [p for p in heldout_prompts(picked, n=n + len(banned)) if p not in banned]
    return out[:n]


@public(vocab_size=integer(len(SPECIALS) + 1, 1 << 20))
def train_tokenizer(corpus: Corpus, vocab_size: int = 2048) -> Any:
    """A byte-level BPE tokenizer (``transformers.PreTrainedTokenizerFast``) for ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.texts("train"), trainer=trainer)
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers lacks hints
        tokenizer_object=tok,
        eos_token=SPECIALS[0],
        bos_token=SPECIALS[0],
        pad_token=SPECIALS[1],
        mask_token=SPECIALS[2],
    )
