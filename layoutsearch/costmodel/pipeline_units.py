"""The units of a pipelined training step, and what each costs per micro-batch.

A pipeline stage runs a contiguous run of *units*: the ops of each top-level
block form one unit; ops outside blocks form ``pre`` (forward ops no block op
precedes, e.g. the embedding, and their backward) and ``post`` (the head and
loss); an optimizer op follows the gradient it applies (:func:`unit_of_ops`).
:func:`unit_costs` gives each unit's ops as the cost model priced them and its
memory per device (parameters, optimizer state, gradients and their
accumulator, saved activations, remat workspace, working set, the activations
entering it); :func:`unit_chain` their order (``pre, layer.0, ..., post``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from layoutsearch.costmodel.memory import remat_plan, transient_buffers
from layoutsearch.costmodel.report import CostReport, OpReport
from layoutsearch.costmodel.step import graph_cached
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import grad_name, top_block
from layoutsearch.layout import Layout

PRE, POST = "pre", "post"


def unit_of_ops(g: Graph) -> dict[str, str]:
    """Op name -> pipeline unit (``pre``, a top-level block name, ``post``) of a training graph (derived once
    per graph object, a fresh dict each call)."""
    return dict(graph_cached(g, "units of ops", lambda: _unit_of_ops(g)))


def _unit_of_ops(g: Graph) -> dict[str, str]:
    unit: dict[str, str] = {}
    block_op = {op.name: top_block(op.block) for op in g.ops if op.block}
    after_block: dict[str, bool] = {}
    for op in g.ops:  # forward: an unblocked op after any block op is post
        if op.phase != "forward":
            continue
        prods = [g.producer(t) for t in op.inputs]
        after_block[op.name] = any(p is not None and (p.name in block_op or after_block.get(p.name, False))
                                   for p in prods)
    feeds_block_bwd: dict[str, bool] = {}
    for op in reversed(g.ops):  # backward: an unblocked op some block's backward needs is post
        if op.phase != "backward":
            continue
        feeds_block_bwd[op.name] = any(c.phase == "backward" and (c.name in block_op or feeds_block_bwd.get(c.name))
                                       for c in g.consumers[op.output])
    for op in g.ops:
        if op.name in block_op:
            unit[op.name] = block_op[op.name]
        elif op.phase == "forward":
            unit[op.name] = POST if after_block[op.name] else PRE
        elif op.phase == "backward":
            unit[op.name] = POST if feeds_block_bwd[op.name] else PRE
    for op in g.ops:  # optimizer: follows the gradient it applies, or the parameter's first user
        if op.phase == "optimizer" and op.name not in unit:
            unit[op.name] = _optimizer_unit(g, op, unit)
    return unit


def _optimizer_unit(g: Graph, op: O.Op, unit: dict[str, str]) -> str:
    for t in op.inputs:
        p = g.producer(t)
        if p is not None and p.name in unit and p.phase == "backward":
            return unit[p.name]
    for t in op.inputs:
        users = [c for c in g.consumers[t] if c.phase == "forward"]
        if users:
            return unit[users[0].name]
    for t in op.inputs:
        p = g.producer(t)
        if p is not None and p.name in unit:
            return unit[p.name]
    return PRE


@dataclass
class Unit:
    """What one unit costs, per micro-batch unless said otherwise."""

    ops: list[OpReport] = field(default_factory=list)   # forward, backward, recompute (one micro-batch)
    parameters: int = 0
    optimizer_state: int = 0
    gradients: int = 0
    accumulator: int = 0    # M > 1: the gradients accumulated in the master dtype, bytes beyond ``gradients``
    saved: int = 0          # activations kept from the forward to the backward pass
    workspace: int = 0      # remat: the recomputed activations, live together at the recompute point
    working: int = 0        # the largest op working set (activation gradients, collective buffers)
    boundary: int = 0       # bytes of the activations entering the unit (what a stage before it sends)


def unit_costs(g: Graph, rep: CostReport, layout: Layout, unit: dict[str, str], remat: str, accumulate: bool,
               on_chip: frozenset[str]) -> dict[str, Unit]:
    """Per-unit ops and memory of the micro-batch training graph ``g`` under ``layout`` (see the module
    docstring); ``accumulate``: gradients accumulate over several micro-batches."""
    units: dict[str, Unit] = defaultdict(Unit)
    for r in rep.ops:
        if r.phase != "optimizer":
            units[unit[r.op]].ops.append(r)
    plan = remat_plan(g, remat)
    recomputed = set(plan.recomputed)
    lb = layout.local_bytes
    grads = {grad_name(p.name) for p in g.parameters}
    fed = {t.name for t in g.fed}
    if accumulate:
        for u, nbytes in accumulators(g, layout, unit).items():
            units[u].accumulator = nbytes
    counted: set[tuple[str, str]] = set()

    def add(u: str, what: str, t: str, nbytes: int) -> None:
        if (u, t) not in counted:
            counted.add((u, t))
            setattr(units[u], what, getattr(units[u], what) + nbytes)

    for op in g.ops:
        u = unit[op.name]
        for t in (*op.inputs, op.output):
            tensor = g.tensors[t]
            if t in fed and tensor.role == "parameter" and op.phase == "forward":
                add(u, "parameters", t, lb(tensor))
            elif t in fed and tensor.role == "optimizer_state":
                add(u, "optimizer_state", t, lb(tensor))
            elif t in grads:
                add(u, "gradients", t, lb(tensor))
        if op.phase != "forward" or op.name in recomputed:
            for t in op.inputs:  # what a backward (or recomputing) op reads from the forward pass is saved
                tensor = g.tensors[t]
                producer = g.producer(t)
                forward = (producer is not None and producer.phase == "forward") or (
                    t in fed and tensor.role == "input")
                if forward and t not in on_chip and t not in plan.dropped:
                    add(u, "saved", "saved:" + t, lb(tensor))
    for name in plan.recomputed:
        op = g.op(name)
        if op.output not in on_chip:
            units[unit[name]].workspace += lb(g.tensors[op.output])
    for op, cost in zip(g.ops, rep.op_costs, strict=True):
        if op.phase == "optimizer":
            continue
        u = unit[op.name]
        own, shared = transient_buffers(op, cost, lb(g.tensors[op.output]))
        grads_live = sum(lb(g.tensors[t]) for t in (*op.inputs, op.output)
                         if t not in on_chip and g.tensors[t].role == "gradient" and t not in grads)
        units[u].working = max(units[u].working, own + sum(shared.values()) + grads_live)
        if op.phase == "forward":
            for t in op.inputs:
                p = g.producer(t)
                entering = (p is None and g.tensors[t].role == "input") or (p is not None and unit[p.name] != u)
                if entering:
                    add(u, "boundary", "in:" + t, lb(g.tensors[t]))
    return units


def accumulators(g: Graph, layout: Layout, unit: dict[str, str]) -> dict[str, int]:
    """Per unit, the bytes gradient accumulation adds to its gradients: each parameter gradient a unit's ops
    touch, accumulated at its master weight's width (fp32 for bf16 gradients under mixed precision), less the
    gradient's own bytes (none without master weights)."""
    master = g.meta.get("training", {}).get("master_weights") or {}
    wider = {grad_name(p.name): g.tensors[master[p.name]].itemsize if p.name in master else None
             for p in g.parameters}
    out: dict[str, int] = defaultdict(int)
    counted: set[tuple[str, str]] = set()
    for op in g.ops:
        u = unit[op.name]
        for t in (*op.inputs, op.output):
            if t in wider and (u, t) not in counted:
                counted.add((u, t))
                tensor = g.tensors[t]
                out[u] += layout.local_bytes(tensor) // tensor.itemsize * ((wider[t] or tensor.itemsize)
                                                                            - tensor.itemsize)
    return out


def unit_chain(g: Graph, unit: dict[str, str]) -> list[str]:
    """The units in the order a micro-batch runs through them: ``pre``, the blocks, ``post``."""
    blocks = list(dict.fromkeys(unit[op.name] for op in g.ops if op.phase == "forward"))
    mid = [b for b in blocks if b not in (PRE, POST)]
    return ([PRE] if PRE in blocks else []) + mid + ([POST] if POST in blocks else [])


__all__ = ["POST", "PRE", "Unit", "accumulators", "unit_chain", "unit_costs", "unit_of_ops"]
