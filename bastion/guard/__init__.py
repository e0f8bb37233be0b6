"""The guard on the public API: arguments are checked where a caller hands them over.

One layer, raising :class:`ArgumentError` (or the error a function names) whose message names
the function and the argument, says what it got and what is accepted:

- :func:`public`, the decorator on every public function and class (its ``__init__``) that
  takes arguments, and on the methods that take a caller's input (a class's constructors such
  as ``from_dict``, a cost model's ``cost_curve``): each argument is checked against the
  parameter's annotation — ``int`` takes an integer (not a bool) within ±2**63, ``float`` a
  finite real number (±inf too where the default is infinite), ``str``/``bool`` their type,
  ``Path`` a ``str`` or ``os.PathLike`` (converted to a ``Path``), a class an instance of it,
  ``Sequence[X]``/``list[X]``/``Mapping`` their container and items, ``Literal`` one of its
  values, a ``Callable`` something callable, ``npt.NDArray`` a numeric numpy array,
  ``npt.ArrayLike`` a numeric array-like; ``None`` only where the annotation or the default
  allows it. ``Any``, type variables and protocols are not checked (duck typing stays).
- rules for what an annotation cannot say, given to the decorator by parameter name
  (:func:`integer`, :func:`number`, :func:`array`, :func:`each`, :func:`has`,
  :func:`mapping_with`, :func:`readable_file`, :func:`writable_file`), and agreements between
  parameters (``lengths=``, ``broadcast=``);
- the same checks as plain functions for a function body (:func:`as_int`, :func:`as_float`,
  :func:`finite_array`, :func:`same_length`, :func:`output_path`), and :func:`forwarded` for a
  caller's arguments the library hands on to another public function as they came.

Past the boundary nothing is checked again: a call from the library's own modules
(``bastion.*`` and the simulator, but not the command line, which hands over what a user typed)
goes straight to the function after one frame look-up (well under a microsecond). The functions
a decode step calls several times — the best-first builders (``best_first``,
``best_first_many``, ``buildable_nodes``), ``tree_from_arrays``, ``learner_of``,
``bastion.cycles.batch_bucket`` and ``lattice_index`` — are not decorated: each checks its
arguments in its body at the cost of one conversion or ``isinstance``. The per-step methods of
the controller and the policies are not checked again (their object was checked when it was
built). What this package does not do: check the inside of arrays beyond their kind unless a rule
says so.

Its modules: :mod:`~bastion.guard.decorator` (:func:`public`), :mod:`~bastion.guard.checks` (the
checks an annotation gives), :mod:`~bastion.guard.rules` (the rules), :mod:`~bastion.guard.values`
(the checks for a function body) and :mod:`~bastion.guard.surface` (the public surface and its
table of rules); every name is imported from here.
"""

from __future__ import annotations

from bastion.guard.checks import INT64_LIMIT
from bastion.guard.decorator import public, unchecked
from bastion.guard.rules import (
    array,
    each,
    has,
    integer,
    mapping_with,
    number,
    readable_file,
    writable_file,
)
from bastion.guard.surface import public_surface, rules_table
from bastion.guard.values import (
    as_float,
    as_int,
    finite_array,
    forwarded,
    is_finite,
    output_path,
    same_length,
)

__all__ = [
    "INT64_LIMIT",
    "array",
    "as_float",
    "as_int",
    "each",
    "finite_array",
    "forwarded",
    "has",
    "integer",
    "is_finite",
    "mapping_with",
    "number",
    "output_path",
    "public",
    "public_surface",
    "readable_file",
    "rules_table",
    "same_length",
    "unchecked",
    "writable_file",
]
