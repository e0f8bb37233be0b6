"""``bastion.fastinit.trusted_init`` builds the object the dataclass's own ``__init__`` builds.

The engine, the controller and the simulator build their per-step records (requests, trees,
choices, verification results, step records) without the frozen dataclasses' ``__init__``;
each must be the same class with the same fields and defaults, and classes that need their
``__init__`` (a ``__post_init__``, a default factory, slots) are refused.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bastion.batch import BatchVerifyResult, KVRoom, StepRequests, TreeBatch
from bastion.controller import ControllerChoice
from bastion.engine import BatchStepRecord
from bastion.errors import ArgumentError
from bastion.fastinit import trusted_init
from bastion.interfaces import BatchChoice, BatchPolicyContext


def _same(a: object, b: object) -> None:
    assert type(a) is type(b)
    assert vars(a).keys() == vars(b).keys()
    for name, value in vars(a).items():
        assert value is vars(b)[name]


def test_trusted_init_builds_what_init_builds() -> None:
    ids = np.arange(3, dtype=np.int64)
    args = (ids, ids + 10, ids * 0, ids * 0, np.zeros(3))
    _same(trusted_init(StepRequests)(*args), StepRequests(*args))
    _same(trusted_init(StepRequests)(*args, riding_tokens=5), StepRequests(*args, riding_tokens=5))
    tree = (np.array([0, 1]), ids[:1] - 1, ids[:1], ids[:1], np.ones(1), ids[:1])
    _same(trusted_init(TreeBatch)(*tree), TreeBatch(*tree))
    _same(trusted_init(BatchVerifyResult)(ids, ids, ids), BatchVerifyResult(ids, ids, ids))
    why = ("tree", 1.5, 1.5, 1.2, 0.01)
    a = trusted_init(ControllerChoice)(*why, repeated=True)
    b = ControllerChoice(*why, repeated=True)
    _same(a, b)
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.kind = "chain"  # type: ignore[misc]
    trees = TreeBatch(*tree)
    _same(trusted_init(BatchChoice)(trees, a, kind="tree"), BatchChoice(trees, a, kind="tree"))
    _same(trusted_init(BatchPolicyContext)(None), BatchPolicyContext(None))  # type: ignore[arg-type]
    rec = (None, trees, None, 0.1, 0.2, 0.3)
    _same(trusted_init(BatchStepRecord)(*rec), BatchStepRecord(*rec))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        trusted_init(StepRequests)(ids)  # the fields without defaults are required


def test_trusted_init_refuses_classes_that_need_init() -> None:
    @dataclasses.dataclass(frozen=True)
    class Factory:
        x: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slots:
        x: int

    for cls in (KVRoom, Factory, Slots, int, None, ControllerChoice("ar", 1, 1, 1, 1)):
        with pytest.raises(ArgumentError):  # KVRoom has a __post_init__; an instance is no class
            trusted_init(cls)  # type: ignore[arg-type]


def test_a_normalising_post_init_may_be_skipped_when_asked() -> None:
    """normalised=True: a class whose __post_init__ only normalises its fields is built
    without it (the caller passes them normalised) — KVRoom, as the simulator's server does;
    anything but a bool is refused, and slots or default factories still are."""
    room = np.array([3, 5], np.int64)
    made = trusted_init(KVRoom, normalised=True)(room, 7, 16)
    _same(made, KVRoom(room, 7, 16))
    assert made.room is room and made.fits([2, 4])
    for junk in (1, "yes", None):
        with pytest.raises(ArgumentError, match="normalised"):
            trusted_init(KVRoom, normalised=junk)  # type: ignore[arg-type]

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slots:
        x: int

    with pytest.raises(ArgumentError):
        trusted_init(Slots, normalised=True)


def test_field_names_cannot_collide_with_the_generated_constructors_own_names() -> None:
    """The generated ``make`` names the new object and its globals (the class, ``object.__new__``,
    the defaults); fields named like any of them — ``o``, ``d``, ``_new``, ``_cls``, ``_d0``, or
    the generator's own prefix — are still stored as given, and defaults still apply."""

    @dataclasses.dataclass(frozen=True)
    class Clash:
        o: int
        d: int
        _new: int
        _cls: int
        _ti: int
        _tinew: int
        _ti_cls: int
        _d0: int = 7
        _d7: int = 8

    values = tuple(range(1, 10))
    _same(trusted_init(Clash)(*values), Clash(*values))
    _same(trusted_init(Clash)(*values[:7]), Clash(*values[:7]))
    made = trusted_init(Clash)(**{f.name: f.name for f in dataclasses.fields(Clash)})
    assert vars(made) == {f.name: f.name for f in dataclasses.fields(Clash)}
