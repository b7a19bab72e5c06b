"""Which tensors reach HBM: kernel fusion and flash attention.

Without fusion (``Hardware.fusion`` False: the ``cpu-sim`` preset, priced as the
compiled-program agreement tests count it) every op reads its inputs from HBM
and writes its output there, and every tensor occupies memory from its producer
to its last consumer.

Fusion (XLA on GPU and TPU; Megatron-LM's fused kernels)
--------------------------------------------------------
XLA fuses elementwise ops, reductions, normalizations and reshapes with their
producers and consumers into one kernel ("loop" and "input" fusions, XLA's
``instruction_fusion`` / ``multi_output_fusion`` passes), so a tensor passed
between such ops never reaches HBM; matmuls (cuBLAS / MXU kernels), gathers and
scatters are fusion barriers here. A tensor stays *on chip* when

* a fusible op produces it and only fusible ops of the same phase (forward,
  backward, optimizer) read it — a tensor the backward pass reads is saved for it
  and must be written, and so is one a matmul reads;
* it is neither fed in, nor a new parameter or state value, nor the loss.

The classification does not depend on the layout (so the solvers price it as
the report does): a collective on such a tensor is rare under rules layouts
(reshards happen at matmul inputs and outputs, which are in HBM anyway) and is
priced as if it read the fused kernel's registers.

Fusible ops joined by on-chip tensors form one *fusion group*; a tensor the
group reads from HBM is read once, however many of its ops read it (multi-output
fusion), and a tensor the group writes is not read back by the group's other
ops. Reshapes are layout changes XLA performs as bitcasts: no traffic. Each
op's HBM bytes (:attr:`OpCost.hbm_bytes`) become its share of its group's
traffic (:meth:`FusionPlan.cost`: per op, which inputs it reads from HBM and
whether it writes its output), and on-chip tensors take no memory
(:func:`~layoutsearch.costmodel.memory.simulate`).

Flash attention (``attention="flash"``)
---------------------------------------
Dao et al. 2022 ("FlashAttention", NeurIPS) and Dao 2023 ("FlashAttention-2"):
the attention core ``softmax(q·k) · v`` runs tile by tile in on-chip memory;
the ``[.., seq, kv_seq]`` scores, probabilities and their gradients never reach
HBM (in time and in memory: only the per-row log-sum-exp is kept, which this
model neglects), and the backward pass recomputes ``q·k`` and the softmax from
``q`` and ``k`` (Dao 2023, algorithm 2), whose FLOPs the report adds in phase
``recompute``. The core is found structurally: a softmax whose input comes from
an einsum of two activations (through elementwise ops such as a scale or a
mask) and whose output an einsum with another activation reads (directly or
through such ops). Attention dropout, ``mul(probs, dropout_mask(probs))``, is
part of the core: FlashAttention applies it on chip and regenerates the mask
from the saved RNG state in its backward pass (Dao et al. 2022, algorithms 2
and 4), so the mask and the dropped probabilities stay on chip too and
the backward pass recomputes the mask and the dropout with the softmax.

Kernels
-------
:attr:`FusionPlan.kernels` names the ops that start a kernel, each once per execution: every op without
fusion; with it, the first op of each fusion group (one XLA fusion) and every op outside a group (a matmul,
a gather), reshapes none (bitcasts); a flash-attention core one kernel forward (from ``q·k`` to the einsum
reading the probabilities) and one backward (every backward op reading or writing its score gradients, the
recomputation inside it). A step runs these kernels one after another on its compute stream:
:attr:`~layoutsearch.mesh.Hardware.kernel_latency` each (the report's ``kernel launches``). Collectives run
on their own streams and are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from layoutsearch.costmodel.ops import OpCost, is_matmul
from layoutsearch.costmodel.step import graph_cached, replaced, resized_from
from layoutsearch.errors import CostModelError
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.mesh import Hardware

ATTENTION_KINDS = ("standard", "flash")
"""How the attention core runs: materializing the scores, or as a flash-attention kernel."""

FUSIBLE = (O.Elementwise, O.Reduce, O.Softmax, O.SoftmaxGrad, O.LayerNorm, O.LayerNormGrad, O.CrossEntropy,
           O.CrossEntropyGrad, O.Reshape, O.Slice, O.Pad, O.Concat)
"""Op kinds a fusing backend merges with their producers and consumers (and einsums that are no matmuls,
:func:`~layoutsearch.costmodel.ops.is_matmul`)."""


def fusible(op: O.Op, g: Graph) -> bool:
    """Whether a fusing backend merges ``op`` with its producers and consumers."""
    return isinstance(op, FUSIBLE) or (isinstance(op, O.Einsum) and not is_matmul(op, g.tensors))


@dataclass(frozen=True)
class AttentionCore:
    """One flash-attention core: the score tensors it keeps on chip and the forward
    ops (``q·k`` through the softmax, and the attention dropout) its backward pass recomputes.

    ``scores`` = ``forward`` (its forward score tensors and dropout masks) | ``backward`` (the backward
    tensors of its block with the scores' dims: one frozenset shared by the cores of a block, so that a
    graph without block tags, whose cores all have block None, holds it once, not once per core);
    ``context``: the einsum that reads the probabilities (with the values)."""

    forward: frozenset[str]
    recompute: tuple[str, ...]
    block: str | None
    backward: frozenset[str] = frozenset()
    context: str = ""

    @property
    def scores(self) -> frozenset[str]:
        return self.forward | self.backward

    def keeps(self, tensor: str) -> bool:
        """Whether ``tensor`` is one of :attr:`scores` (without building that set)."""
        return tensor in self.forward or tensor in self.backward


@dataclass(frozen=True)
class FusionPlan:
    """The fusion model of one training graph (layout-independent).

    ``on_chip``: tensors that never reach HBM (and take no memory);
    ``charged[op]``: for each input of ``op``, whether ``op`` reads it from HBM
    (False: on chip, or already read by its fusion group); ``writes[op]``:
    whether ``op`` writes its output to HBM; ``flash``: the flash-attention
    cores (empty with ``attention="standard"``); ``fused``: whether the backend
    fuses; ``kernels``: the ops that start a kernel (see the module docstring).
    Ops absent from ``charged`` read and write everything."""

    fused: bool
    on_chip: frozenset[str]
    charged: dict[str, tuple[bool, ...]] = field(hash=False, compare=False)
    writes: dict[str, bool] = field(hash=False, compare=False)
    flash: tuple[AttentionCore, ...] = ()
    kernels: frozenset[str] = field(default=frozenset(), hash=False, compare=False)

    def cost(self, op: O.Op, cost: OpCost) -> OpCost:
        """``cost`` of ``op`` (or of an op of the same shapes, priced for another layout) with the HBM
        traffic this plan gives ``op``."""
        charged = self.charged.get(op.name)
        if charged is None:
            return cost
        hbm = sum(b for b, c in zip(cost.reads, charged, strict=False) if c) + (cost.write if self.writes[op.name]
                                                                                else 0)
        return cost if hbm == cost.hbm_bytes else replaced(cost, {"hbm_bytes": float(hbm)})

    def signature(self, op: O.Op) -> tuple:
        """What ``op``'s HBM traffic depends on in this plan (for caches keyed by op shapes)."""
        return (self.charged.get(op.name), self.writes.get(op.name))


def check_attention(attention: str, error: type[Exception] = CostModelError, auto: bool = True) -> str:
    """``attention`` if it is one of :data:`ATTENTION_KINDS` (or ``auto``, unless ``auto=False``), else
    ``error`` naming them."""
    known = ("auto", *ATTENTION_KINDS) if auto else ATTENTION_KINDS
    if attention not in known:
        raise error(f"unknown attention {attention!r} (known: {', '.join(known)})")
    return attention


def resolve_attention(attention: str, hw: Hardware) -> str:
    """``attention`` with ``"auto"`` resolved: flash where the backend fuses kernels (flash-attention kernels
    exist for GPUs and TPUs: FlashAttention, cuDNN, Pallas splash attention), standard otherwise."""
    if check_attention(attention) == "auto":
        return "flash" if hw.fusion else "standard"
    return attention


def fusion_plan(g: Graph, fused: bool, attention: str = "standard") -> FusionPlan:
    """The fusion plan of training graph ``g`` (cached per graph)."""
    check_attention(attention, auto=False)
    def compute() -> FusionPlan:
        plan = _resized_plan(g, fused, attention)
        return plan if plan is not None else _plan(g, fused, attention)
    return graph_cached(g, ("fusion", fused, attention), compute)


def _resized_plan(g: Graph, fused: bool, attention: str) -> FusionPlan | None:
    """The plan of the graph ``g`` resizes (one micro-batch of it, :func:`~.step.resized_from`), which is
    ``g``'s: a plan reads no size but which einsums run as matmuls (:func:`is_matmul`, a global contraction
    size); None when ``g`` is no resize, or some einsum runs otherwise in it."""
    origin = resized_from(g)
    if origin is None:
        return None
    big = origin[0]
    if any(isinstance(op, O.Einsum) and is_matmul(op, g.tensors) != is_matmul(op, big.tensors) for op in g.ops):
        return None
    return fusion_plan(big, fused, attention)


def _plan(g: Graph, fused: bool, attention: str) -> FusionPlan:
    flash = attention_cores(g) if attention == "flash" else ()
    scores = frozenset().union(*(c.forward for c in flash), *{id(c.backward): c.backward for c in flash}.values())
    if not fused and not scores:
        return FusionPlan(False, frozenset(), {}, {}, (), frozenset(op.name for op in g.ops))
    on_chip: set[str] = set(scores)
    producer = {op.output: op for op in g.ops}
    if fused:
        fed = {t.name for t in g.fed}
        for name, t in g.tensors.items():
            p = producer.get(name)
            users = g.consumers[name]
            if (p is None or name in fed or t.updates is not None or name == g.loss or not users
                    or not fusible(p, g)):
                continue
            if all(fusible(c, g) and c.phase == p.phase for c in users):
                on_chip.add(name)
    group = _groups(g, on_chip - scores, producer) if fused else {}
    charged: dict[str, tuple[bool, ...]] = {}
    writes: dict[str, bool] = {}
    seen: set[tuple[int, str]] = set()
    for op in g.ops:
        gid = group.get(op.name)
        if fused and isinstance(op, O.Reshape):  # a bitcast
            charged[op.name], writes[op.name] = (False,) * len(op.inputs), False
            continue
        marks = []
        for x in op.inputs:
            marks.append(x not in on_chip and (gid is None or (gid, x) not in seen))
            if gid is not None:
                seen.add((gid, x))
        charged[op.name] = tuple(marks)
        writes[op.name] = op.output not in on_chip
        if gid is not None and writes[op.name]:  # written by the group: its other ops read it on chip
            seen.add((gid, op.output))
    return FusionPlan(fused, frozenset(on_chip), charged, writes, flash, _kernels(g, fused, group, flash))


def _kernels(g: Graph, fused: bool, group: dict[str, int], flash: tuple[AttentionCore, ...]) -> frozenset[str]:
    """The ops of ``g`` that start a kernel (see the module docstring). A flash core's backward kernel: the
    backward ops joined through the score tensors they read or write (one per core, whether or not the graph's
    blocks are tagged)."""
    forward = {t: k for k, c in enumerate(flash) for t in c.forward}
    context = {c.context: k for k, c in enumerate(flash)}
    scores = set(forward).union(*{id(c.backward): c.backward for c in flash}.values())
    core: dict[str, tuple[str, int]] = {}  # op of a flash core -> (pass, id of its kernel)
    touching: dict[str, str] = {}  # score tensor -> the first backward op reading or writing it
    links: list[tuple[str, str]] = []
    for op in g.ops:
        if op.phase == "forward" and (op.output in forward or op.name in context):
            core[op.name] = ("forward", forward[op.output] if op.output in forward else context[op.name])
        elif op.phase == "backward" and scores:
            for t in (*op.inputs, op.output):
                if t in scores:
                    links.append((touching.setdefault(t, op.name), op.name))
    backward = _components(dict.fromkeys(b for link in links for b in link), links)
    core.update({name: ("backward", k) for name, k in backward.items()})
    starts: set[str] = set()
    seen: set[tuple[str, int]] = set()
    for op in g.ops:
        if fused and isinstance(op, O.Reshape):
            continue  # a bitcast
        key = core.get(op.name)
        if key is None and op.name in group:
            key = ("group", group[op.name])
        if key is None or key not in seen:
            starts.add(op.name)
        if key is not None:
            seen.add(key)
    return frozenset(starts)


def _components(members: Iterable[str], links: Iterable[tuple[str, str]]) -> dict[str, int]:
    """The connected component of each of ``members`` joined by ``links`` (pairs of members; union-find), numbered
    in the order of ``members``."""
    parent = {m: m for m in members}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in links:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra
    roots: dict[str, int] = {}
    return {m: roots.setdefault(find(m), len(roots)) for m in parent}


def _groups(g: Graph, internal: set[str], producer: dict[str, O.Op]) -> dict[str, int]:
    """Fusion group of each fusible op: fusible ops joined by ``internal`` tensors."""
    members = [op.name for op in g.ops if fusible(op, g)]
    return _components(members, ((producer[name].name, c.name) for name in internal for c in g.consumers[name]))


def attention_cores(g: Graph) -> tuple[AttentionCore, ...]:
    """Every attention core of training graph ``g`` (see the module docstring)."""
    producer = {op.output: op for op in g.ops}
    fed = {t.name for t in g.fed}
    masks = {op.output for op in g.ops if O.is_dropout_mask(op)}
    side = fed | masks  # operands of the chain's elementwise ops that are not the chain's activation

    def activation_einsum(op: O.Op | None) -> bool:
        return isinstance(op, O.Einsum) and len(op.inputs) == 2 and not any(i in fed for i in op.inputs)

    def link(op: O.Op | None) -> bool:
        """An elementwise forward op of one activation (a scale, a mask, a dropout)."""
        return isinstance(op, O.Elementwise) and op.phase == "forward" and not O.is_dropout_mask(op) and sum(
            i not in side for i in op.inputs) == 1

    by: dict[tuple[str | None, frozenset[str]], list[str]] = {}  # (block, dims) -> backward tensors
    for t, p in producer.items():
        if p.phase == "backward":
            by.setdefault((p.block, frozenset(g.tensors[t].dim_names)), []).append(t)
    backward_by = {key: frozenset(ts) for key, ts in by.items()}
    cores = []
    for s in g.ops:
        if not isinstance(s, O.Softmax) or s.phase != "forward":
            continue
        chain = [s]
        op = producer.get(s.inputs[0])
        while link(op):
            chain.append(op)  # type: ignore[arg-type]
            op = producer.get(next(i for i in op.inputs if i not in side))  # type: ignore[union-attr]
        if not activation_einsum(op):
            continue
        chain.append(op)  # type: ignore[arg-type]
        after: list[O.Op] = []  # elementwise ops between the softmax and the einsum reading the probabilities
        out = s.output
        while not any(activation_einsum(c) for c in g.consumers[out]):
            nxt = [c for c in g.consumers[out] if link(c)]
            if len(nxt) != 1:
                break
            after.append(nxt[0])
            out = nxt[0].output
        else:
            forward = {c.output for c in chain[:-1]} | {op.output} | {c.output for c in after}  # type: ignore
            dims = frozenset(g.tensors[s.output].dim_names)
            # dropout masks of the scores' dims: FlashAttention draws them on chip, again in the backward pass
            drawn = [producer[i] for c in (*chain[:-1], *after) for i in c.inputs
                     if i in masks and frozenset(g.tensors[i].dim_names) == dims]
            recompute = [*reversed(chain), *dict.fromkeys(drawn), *after]
            cores.append(AttentionCore(frozenset(forward | {m.output for m in drawn}),
                                       tuple(c.name for c in recompute), s.block,
                                       backward_by.get((s.block, dims), frozenset()),
                                       next(c.name for c in g.consumers[out] if activation_einsum(c))))
    return tuple(cores)


__all__ = ["ATTENTION_KINDS", "FUSIBLE", "fusible", "AttentionCore", "FusionPlan", "attention_cores",
           "check_attention", "fusion_plan", "resolve_attention"]
