"""The demo's corpus: a standard library's sources, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.demo.corpus import load_corpus
from bastion.errors import ConfigError


def test_a_directory_without_os_py_is_refused_before_it_is_walked(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"os\.py"):
        load_corpus(tmp_path)
    with pytest.raises(ConfigError, match=r"os\.py"):
        load_corpus(Path("/"))  # the whole disk is not walked


def test_a_standard_library_directory_is_split_by_file(tmp_path: Path) -> None:
    (tmp_path / "os.py").write_text("sep = '/'\n")
    for i in range(40):
        (tmp_path / f"m{i}.py").write_text(f"x = {i}\n")
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text("y = 2\n")  # the tests are skipped
    corpus = load_corpus(tmp_path)
    found = {p.name for p in corpus.train + corpus.heldout}
    assert found == {"os.py"} | {f"m{i}.py" for i in range(40)}
    assert corpus.train and corpus.heldout  # 40 files: both splits hold some
    assert not set(corpus.train) & set(corpus.heldout)
