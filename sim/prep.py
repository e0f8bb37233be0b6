"""HostPrep: the truth's preparation of a step, the work between the drafter pass and verification.

Trees: softmax and top-K over the vocabulary at every draft position, the copy of the top-K to
the host, the best-first builder (or the adaptive controller's decision) and the ancestor
matrices on the host, the mask's upload and construction on the device, and the KV compaction
after acceptance; chains: an argmax per position and its copy back. Each operation's cost comes
from a :class:`~bastion.sim.ground_truth.GroundTruth` field (``docs/simulator.md``, "The ground
truth"). A measured truth's preparation is :mod:`bastion.sim.measured_truth`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from bastion.cost.hardware import HardwareProfile
from bastion.cost.models import DrafterSpec, ModelSpec
from bastion.cost.opcounts import RooflineOptions
from bastion.cost.parallel import tp_shard
from bastion.errors import ConfigError
from bastion.sim.batching import compiled_sums, quantise
from bastion.sim.ground_truth import GroundTruth


def _tree_sums(
    s: npt.NDArray[np.float64],
    contexts: npt.ArrayLike | None,
    quantum: int,
    sizes: npt.NDArray[np.int64] | None = None,
) -> tuple[float, float, float]:
    """(Σ s, Σ s², Σ s·c + Σ s²) of a step's trees, contexts quantised (Σ s² without them):
    whole numbers, so exact however they are summed; one request's in plain floats, a batch's
    in one compiled call where ``sizes`` (``s`` as int64) and the contexts allow."""
    if sizes is not None and contexts is not None and s.shape[0] > 1:
        got = compiled_sums(sizes, contexts, quantum)
        if got is not None:
            return tree_sums_of(got, quantum)
    if s.shape[0] == 1:  # batch 1: no numpy call
        return _tree_sums_one(float(s[0]), contexts, quantum)
    square = float(np.dot(s, s))
    pairs = square if contexts is None else float(np.dot(s, quantise(contexts, quantum))) + square
    return float(np.add.reduce(s)), square, pairs


def tree_sums_of(got: tuple[int, ...], quantum: int) -> tuple[float, float, float]:
    """:func:`_tree_sums` from :func:`compiled_sums`' five whole numbers."""
    square = float(got[2])
    return float(got[1]), square, float(quantum * got[4]) + square


def _tree_sums_one(
    n: float, contexts: npt.ArrayLike | None, quantum: int
) -> tuple[float, float, float]:
    """:func:`_tree_sums` of one tree of ``n`` nodes: Python floats (whole numbers, exact)."""
    square = n * n
    if contexts is None:
        return n, square, square
    c = np.asarray(contexts).reshape(-1)
    if c.shape[0] != 1:  # (one tree, other than one context: numpy's form)
        s = np.array([n])
        return n, square, float(np.dot(s, quantise(contexts, quantum))) + square
    return tree_sums_at(n, float(c[0]), quantum)


def tree_sums_at(n: float, context: float, quantum: int) -> tuple[float, float, float]:
    """:func:`_tree_sums` of one tree of ``n`` nodes at one context, on Python floats."""
    square = n * n
    return n, square, n * float(math.ceil(context / quantum) * quantum) + square


class HostPrep:
    """The truth's preparation time of one step for one target, drafter and device (fixed
    at construction: the terms that depend on them alone are formed once)."""

    def __init__(
        self,
        truth: GroundTruth,
        model: ModelSpec,
        drafter: DrafterSpec,
        device: HardwareProfile,
        options: RooflineOptions,
        byte_rate: float,
    ) -> None:
        self.truth, self.model, self.device, self.options = truth, model, device, options
        self.depth = float(drafter.block_size - 1)  # draft positions per request
        self.byte_rate = byte_rate  # the truth device's achievable bytes/s
        # the KV width one GPU compacts (its share of the KV heads under tensor parallelism);
        # the logits are the whole vocabulary's (gathered before the top-K)
        self.h_kv = tp_shard(model, options.tensor_parallel).h_kv
        # from_sums' terms that depend on the truth, model and device alone, each formed once
        # by the operations (and in the order) its formula uses per step
        t, layers = truth, model.layers
        self._kv_scale = 4.0 * layers  # the K and V read and written, per layer
        self._slots = self.depth + 1.0  # a request's tokens compacted, at most
        self._vocab, self._act_bytes = model.vocab, options.bytes_per_act
        kernels = t.prep_tree_kernels + t.mask_kernels + t.compaction_kernels_per_layer * layers
        self._tree_launch_s = kernels * (t.host_kernel_s + device.launch_overhead_s)
        self._copies_s = t.d2h_latency_s + t.h2d_latency_s
        # the controller's host seconds of a tree step by B (pure functions of B and the truth;
        # a B is a batch size, so they stay few): a repeated decision's, a decision's
        self._repeats: dict[int, float] = {}
        self._decisions: dict[int, float] = {}

    def seconds(
        self,
        tree_sizes: npt.ArrayLike,
        topk: bool = True,
        contexts: npt.ArrayLike | None = None,
        controller: bool | str = False,
        path: bool = False,
    ) -> float:
        """:meth:`bastion.sim.gpu.SimulatedGPU.prep_truth` under a roofline truth."""
        one: float | None = None  # batch 1's one tree size (its sums on Python floats)
        if isinstance(tree_sizes, np.ndarray) and tree_sizes.shape == (1,):
            one, b = float(tree_sizes[0]), 1
        else:
            if isinstance(tree_sizes, np.ndarray) and tree_sizes.ndim == 1:
                s = tree_sizes.astype(np.float64, copy=False)
            else:
                s = np.atleast_1d(np.asarray(tree_sizes, dtype=np.float64))
            b = s.shape[0]
        sums = None  # chains: no tree work, no tree sums
        if topk and not path:
            if one is None:
                given = tree_sizes if isinstance(tree_sizes, np.ndarray) else None
                sums = _tree_sums(s, contexts, self.truth.context_quantum, given)
            else:
                sums = _tree_sums_one(one, contexts, self.truth.context_quantum)
        return self.from_sums(b, sums, topk, controller, path)

    def from_sums(
        self,
        b: int,
        sums: tuple[float, float, float] | None,
        topk: bool = True,
        controller: bool | str = False,
        path: bool = False,
    ) -> float:
        """:meth:`seconds` of ``b`` requests whose trees' (Σ s, Σ s², Σ s·c + Σ s²), contexts
        quantised, are ``sums`` (what :func:`_tree_sums` gives; unused, and may be None, for
        chains: ``not topk or path``). The simulated GPU's batched step passes the sums it
        computed for its passes (one compiled call for the three)."""
        t = self.truth
        logits = b * self.depth * self._vocab
        bw = self.byte_rate
        if not topk or path:  # chains: the argmax, or a decision's top-K pass; no tree work
            per_logit, launches = (
                (t.prep_topk_bytes, t.prep_tree_kernels)
                if topk
                else (t.prep_argmax_bytes, t.prep_chain_kernels)
            )
            seconds = logits * per_logit / bw
            seconds += launches * (t.host_kernel_s + self.device.launch_overhead_s)
            seconds += t.d2h_latency_s
            if controller == "repeat":  # a chain decision that stood (argmax), or a repeat
                seconds += self._chain_s(b) if not topk else self._repeat_s(b)
            elif controller and topk:
                seconds += self._decision_s(b)
        else:
            if sums is None:
                raise ConfigError("a tree step's preparation needs its trees' sums")
            nodes, square, pairs = sums
            # tokens compacted, at most: min(slots, nodes / max(b, 1)) · b as min and max pick
            per = nodes / (1 if b < 1 else b)
            moved = (per if per < self._slots else self._slots) * b
            # read + write K and V, each element bytes_per_act (2 unless the truth says)
            kv_bytes = self._kv_scale * moved * self.h_kv * self._act_bytes
            seconds = (logits * t.prep_topk_bytes + pairs * t.mask_bytes + kv_bytes) / bw
            seconds += self._tree_launch_s  # the tree's, the mask's and the compaction's kernels
            seconds += self._copies_s + square / t.h2d_bandwidth
            seconds += b * t.mask_host_request_s + square * t.mask_host_element_s
            if controller:  # the path taken: a repeated decision, or a decision (whose
                # measured time includes growing the trees)
                cache = self._repeats if controller == "repeat" else self._decisions
                host = cache.get(b)
                if host is None:
                    host = self._repeat_s(b) if cache is self._repeats else self._decision_s(b)
                    cache[b] = host
                seconds += host
            else:
                seconds += t.tree_step_s + b * t.tree_request_s + nodes * t.tree_node_s
        return float(seconds)

    def _decision_s(self, b: int) -> float:
        """The controller's host time for a full decision of ``b`` requests: the
        single-request controller at batch 1, the joint chooser above."""
        t = self.truth
        if b == 1:
            return t.controller_single_s
        return t.controller_step_s + b * t.controller_request_s

    def _repeat_s(self, b: int) -> float:
        """The learning controller's host time for a step that repeats its last decision, as
        measured (``controller_repeat_*``), or as a decision where the truth has no measurement
        (−1)."""
        t = self.truth
        return self._measured_s(
            b,
            (t.controller_repeat_single_s, t.controller_repeat_step_s),
            t.controller_repeat_request_s,
            self._decision_s,
        )

    def _chain_s(self, b: int) -> float:
        """The learning controller's host time for a step of a chain decision that stood, as
        measured (``controller_chain_*``), or as a repeated decision where the truth has no
        measurement (−1)."""
        t = self.truth
        return self._measured_s(
            b,
            (t.controller_chain_single_s, t.controller_chain_step_s),
            t.controller_chain_request_s,
            self._repeat_s,
        )

    @staticmethod
    def _measured_s(
        b: int, single_step: tuple[float, float], request: float, otherwise: Callable[[int], float]
    ) -> float:
        """A host time measured at batch 1 (``single_step[0]``) and above it as step +
        B·request (``single_step[1]``, ``request``); a −1 (not measured): ``otherwise(b)``."""
        single, step = single_step
        if b == 1 and single >= 0:
            return single
        if b > 1 and step >= 0:
            return step + b * max(request, 0)
        return otherwise(b)
