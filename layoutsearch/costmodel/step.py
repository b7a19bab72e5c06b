"""The training step a cost is asked about, and the cost of each of its ops under a layout.

Solvers price one graph under many layouts, so what does not depend on the
layout is computed once per graph object and remembered (:func:`graph_cached`):
the derived training graph (:func:`training_step`), remat plans, model FLOPs,
and which ops are *repeats* of one another.

Two ops are repeats when they are the same op (kind, attributes, phase) over
tensors of the same dims and dtypes, and every name of one (the op, its
inputs, its output) is the other's with its block prefix swapped
(``layer.3/ff_in`` for ``layer.2/ff_in``, ``grad/layer.3/wi`` for
``grad/layer.2/wi``). Under global layout rules (which lay out a tensor by its
dim names) repeats cost the same, so :func:`step_costs` runs the op rules
(:class:`~layoutsearch.costmodel.ops.OpRules`) once per group and renames
the result: a 96-layer GPT-3 step costs as much to price as a few layers.
Ops whose tensors the layout names explicitly (``Layout.with_tensor``) are
priced one by one.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

from layoutsearch.costmodel.ops import OpCost, OpRules
from layoutsearch.ir import ops as O
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import SEP, scope_prefix
from layoutsearch.ir.precision import DEFAULT_PRECISION, Precision
from layoutsearch.ir.training import Optimizer, resized_training_graph, training_graph
from layoutsearch.layout import Layout

_CACHE: dict[tuple[int, Any], tuple[weakref.ref[Graph], Any]] = {}
_CACHE_SIZE = 512


def graph_cached(graph: Graph, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, remembered for the graph object ``graph`` and ``key``
    (a small LRU-free cache of layout-independent analyses; an entry goes when
    its graph is garbage-collected, so a large training graph derived from a
    dropped forward graph is not kept alive by the cache)."""
    k = (id(graph), key)
    hit = _CACHE.get(k)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    value = compute()
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[k] = (graph_ref(graph, _CACHE, k), value)
    return value


def graph_ref(graph: Graph, cache: dict, key: Any) -> weakref.ref[Graph]:
    """A weak reference to ``graph`` for the entry ``cache[key] = (reference, value)``: the entry goes with
    the graph (unless it was replaced meanwhile)."""
    def drop(ref: weakref.ref[Graph], cache: dict = cache, key: Any = key) -> None:
        # the cache is bound here: at interpreter exit, when module globals are cleared, graphs still
        # collected call this after the module's caches are gone
        hit = cache.get(key)
        if hit is not None and hit[0] is ref:
            del cache[key]

    return weakref.ref(graph, drop)


def resized(graph: Graph, sizes: dict[str, int]) -> Graph:
    """``graph.with_sizes(sizes)``, one object per graph object and sizes: the analyses cached per graph
    (its training graph, remat plans, fusion plan, repeats) are derived once per micro-batch size, however
    many layouts, remat policies and pipelines are priced on it."""
    if all(graph.dims.get(d) == s for d, s in sizes.items()):
        return graph

    return graph_cached(graph, ("sizes", tuple(sorted(sizes.items()))),
                        lambda: _resize_of(graph.with_sizes(sizes), graph, sizes))


def _resize_of(small: Graph, big: Graph, sizes: dict[str, int]) -> Graph:
    """``small``, remembered as ``big`` resized to ``sizes`` (:func:`resized_from`)."""
    _RESIZED_FROM[id(small)] = (graph_ref(small, _RESIZED_FROM, id(small)), weakref.ref(big), dict(sizes))
    return small


_RESIZED_FROM: dict[int, tuple[weakref.ref[Graph], weakref.ref[Graph], dict[str, int]]] = {}
"""A graph :func:`resized` made, or its training step -> (itself, the graph it resized or that graph's training
step, the sizes)."""


def resized_from(graph: Graph) -> tuple[Graph, dict[str, int]] | None:
    """(the graph ``graph`` is a resize of, the sizes) when :func:`resized` made it (or its training step, from
    that graph's), else None: analyses that do not read the sizes are the other's."""
    origin = _RESIZED_FROM.get(id(graph))
    if origin is None or origin[0]() is not graph or (big := origin[1]()) is None:
        return None
    return big, origin[2]


def checked(layout: Layout, graph: Graph) -> Layout:
    """``layout.check(graph)``, with the same errors, faster: a layout of global rules lays out a tensor by its
    dim names alone, so one tensor per distinct tuple of dim names is checked (the first, in graph order; on an
    error the full check runs, raising what it raises)."""
    if layout.tensors:
        return layout.check(graph)
    for dim, _ in layout.rules:
        if dim not in graph.dims:
            return layout.check(graph)
    firsts = graph_cached(graph, "dim_name_sets",
                          lambda: tuple({t.dim_names: t for t in reversed(list(graph.tensors.values()))}.values()))
    mesh = layout.mesh
    for t in firsts:
        for d, axes in layout.rules_layout(t.dim_names).items():
            if graph.dims[d] % mesh.group_size(axes):
                return layout.check(graph)
    return layout


def is_training_graph(graph: Graph) -> bool:
    """Whether ``graph`` already holds backward or optimizer ops."""
    return any(op.phase != "forward" for op in graph.ops)


def training_step(graph: Graph, optimizer: Optimizer | str = "adam",
                  precision: Precision | str = DEFAULT_PRECISION) -> Graph:
    """``graph`` if it is a training graph, else its training graph with ``optimizer``
    under the ``precision`` policy (derived once per forward graph object, optimizer and policy; of a graph
    :func:`resized` made, the resized graph's, :func:`~layoutsearch.ir.training.resized_training_graph`)."""
    if is_training_graph(graph):
        return graph
    opt = Optimizer.of(optimizer)
    policy = Precision.of(precision)

    def derive() -> Graph:
        origin = resized_from(graph)
        if origin is not None:
            big = training_step(origin[0], opt, policy)
            small = resized_training_graph(big, origin[0], origin[1])
            if small is not None:
                return _resize_of(small, big, origin[1])
        return training_graph(graph, opt, policy)
    return graph_cached(graph, ("training", opt, policy), derive)


def op_signature(op: O.Op, graph: Graph) -> tuple[Any, ...]:
    """What an op's cost depends on besides its names and the layout: its kind and cost attributes, its phase,
    which of its inputs are the same tensor, and the dims and dtypes of its inputs and output. Repeated ops
    (:func:`repeats`) and tied blocks (:func:`layoutsearch.solvers.blocks.block_families`) have equal
    signatures."""
    t = graph.tensors
    same = tuple(op.inputs.index(n) for n in op.inputs)
    attrs = tuple(sorted((k, repr(v)) for k, v in op.cost_attrs().items()))
    return (type(op), attrs, op.phase, same, tuple((t[n].dims, t[n].dtype) for n in op.inputs),
            (t[op.output].dims, t[op.output].dtype))


def signature_ids(graph: Graph) -> dict[str, int]:
    """Per op name, a small integer standing for its :func:`op_signature`: equal for two ops of ``graph``
    exactly when their signatures are equal (cached per graph; cheap to hash, where a signature's nested
    tuples of dims are rehashed on every dictionary lookup)."""
    def compute() -> dict[str, int]:
        ids: dict[tuple[Any, ...], int] = {}
        return {op.name: ids.setdefault(op_signature(op, graph), len(ids)) for op in graph.ops}

    return graph_cached(graph, "signature ids", compute)


def _names(op: O.Op) -> tuple[str, ...]:
    return (op.name, op.output, *op.inputs)


def _maps(rep: O.Op, op: O.Op) -> bool:
    """Whether ``op``'s names are ``rep``'s with the block prefix swapped."""
    if rep.block is None or op.block is None:
        return False
    old, new = scope_prefix(rep.block), scope_prefix(op.block)
    return all(b == a.replace(old, new) for a, b in zip(_names(rep), _names(op), strict=True))


def _bordered(prefix: str) -> bool:
    """Whether a proper prefix of ``prefix`` is also its suffix (``"a/a/"``: ``"a/"``), i.e. two occurrences
    of ``prefix`` in a string can overlap."""
    return any(prefix[:k] == prefix[-k:] for k in range(1, len(prefix)))


def repeats(graph: Graph) -> tuple[int, ...]:
    """For each op (schedule order), the index of the first op it repeats (itself if none).

    ``op`` repeats ``rep`` when both have the same :func:`op_signature` and
    :func:`_maps` holds; among several such earlier ops, the first. Found in
    time linear in the number of ops (times the names' lengths), not by
    comparing each op with every earlier one of its signature:

    * an op without a block repeats nothing (``_maps`` needs both blocks), so
      it is its own representative and no candidate for later ops;
    * the *canonical key* of a tagged op with block ``B``: its signature and
      each of its names split at ``B/``. When ``rep`` (block ``R``) and ``op``
      have equal keys, ``op``'s names are ``rep``'s names with every ``R/``
      replaced by ``B/``: ``_maps`` holds, and one dict finds such a ``rep``;
    * ``_maps`` can also hold with different keys, but only when a name of
      ``rep`` already contains ``B/`` (then ``op``'s name has ``B/`` where
      ``rep``'s had no ``R/``), or when two occurrences of ``B/`` can overlap
      (:func:`_bordered`, e.g. block ``a/a``). The first case is indexed
      (per signature and block, the representatives with a name containing
      the block's prefix, each checked with ``_maps``); in the second, rare
      one the op is compared with every earlier representative of its
      signature, as before.

    The result is the same as comparing with every earlier representative
    (``tests/test_scaling.py`` checks it against that reference)."""
    def compute() -> tuple[int, ...]:
        ops = graph.ops
        tagged = {op.block for op in ops if op.block is not None}
        # blocks whose prefix cannot overlap itself: their ops take the indexed path
        fast = {b for b in tagged if b and not _bordered(scope_prefix(b))}
        lengths = sorted({len(b) for b in fast})
        canonical: dict[tuple[Any, ...], int] = {}  # canonical key -> its representative
        containing: dict[tuple[Any, str], list[int]] = {}  # (signature, block) -> reps whose names contain block/
        reps: dict[tuple[Any, ...], list[int]] = {}  # signature -> tagged representatives (for bordered blocks)
        out: list[int] = []
        sigs = signature_ids(graph)
        for i, op in enumerate(ops):
            block = op.block
            if block is None:
                out.append(i)
                continue
            sig = sigs[op.name]
            names = _names(op)
            prefix = scope_prefix(block)
            key = (sig, tuple(tuple(n.split(prefix)) for n in names))
            j = None
            if block in fast:
                found = canonical.get(key)
                for r in containing.get((sig, block), ()):
                    if found is not None and r > found:
                        break
                    if _maps(ops[r], op):
                        j = r
                        break
                if j is None:
                    j = found
            else:
                j = next((r for r in reps.get(sig, ()) if _maps(ops[r], op)), None)
            if j is None:
                j = i
                canonical.setdefault(key, i)
                reps.setdefault(sig, []).append(i)
                seen: set[str] = set()
                for n in names:
                    p = n.find(SEP)
                    while p >= 0:
                        for n_len in lengths:
                            if n_len > p:
                                break
                            b = n[p - n_len:p]
                            if b in fast and b != block and b not in seen:
                                seen.add(b)
                                containing.setdefault((sig, b), []).append(i)
                        p = n.find(SEP, p + 1)
            out.append(j)
        return tuple(out)

    return graph_cached(graph, "repeats", compute)


def _rename_key(key: tuple, old: str, new: str) -> tuple:
    """A shared collective's identity (:attr:`~layoutsearch.costmodel.comms.Comm.shared`) with the names in it
    renamed: its top-level strings (nested tuples are layouts, without names)."""
    return tuple([k.replace(old, new) if isinstance(k, str) else k for k in key])


def _plain(cls: type) -> bool:
    """Whether instances of dataclass ``cls`` may be made by filling their ``__dict__`` (no ``__post_init__``,
    no slots): remembered per class."""
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = not (hasattr(cls, "__slots__") or hasattr(cls, "__post_init__"))
    return plain


def replaced(obj: Any, changes: dict[str, Any]) -> Any:
    """``dataclasses.replace(obj, **changes)`` for a frozen dataclass without ``__post_init__`` or slots
    (:class:`OpCost`, :class:`~layoutsearch.costmodel.ops.Comm`): a copy of its fields, without running
    ``__init__`` (pricing a 96-layer step renames a million of them)."""
    if not _plain(type(obj)):
        return dataclasses.replace(obj, **changes)
    new = object.__new__(type(obj))
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    return new


def made(cls: type, *values: Any) -> Any:
    """``cls(*values)`` for a frozen dataclass without ``__post_init__`` or slots, every field given in order,
    without running its ``__init__`` (a frozen dataclass sets each field through ``object.__setattr__``: an
    estimate of a 96-layer step makes 45,000 op reports)."""
    if not _plain(cls):
        return cls(*values)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    if len(values) != len(names):
        raise TypeError(f"{cls.__name__} takes {len(names)} fields, got {len(values)}")
    new = object.__new__(cls)
    new.__dict__.update(zip(names, values))
    return new


_PLAIN: dict[type, bool] = {}
"""Per class, whether :func:`replaced` and :func:`made` may fill its fields directly."""
_FIELDS: dict[type, tuple[str, ...]] = {}
"""Per class, its fields' names in order (for :func:`made`)."""


def _renamed(cost: OpCost, rep: O.Op, op: O.Op) -> OpCost:
    """``rep``'s cost as the cost of its repeat ``op``."""
    old, new = scope_prefix(rep.block), scope_prefix(op.block)  # type: ignore[arg-type]
    comms = []
    for c in cost.comms:
        changes: dict[str, Any] = {"tensor": c.tensor.replace(old, new), "cause": c.cause.replace(old, new)}
        if getattr(c, "shared", None) is not None:
            changes["shared"] = _rename_key(c.shared, old, new)
        comms.append(replaced(c, changes))
    return replaced(cost, {"op": op.name, "block": op.block, "comms": tuple(comms)})


def step_costs(g: Graph, layout: Layout, reduce_scatter: bool = True, memo: bool = True,
               float32_collectives: bool = False, regather_weights: bool = False
               ) -> tuple[list[OpCost], list[OpCost]]:
    """The cost of every op of ``g`` under ``layout``: as each op sees it (all its
    collectives: for memory), and for the step (a collective that several ops
    share, ``Comm.shared``, kept by its first op only: for time and bytes).

    ``memo``: price repeated ops once (see the module docstring); False prices
    every op (the reference the memoized result is tested against). ``reduce_scatter``,
    ``float32_collectives``, ``regather_weights``: the backend's behaviour
    (:class:`~layoutsearch.mesh.Hardware`)."""
    from layoutsearch.costmodel import ops as op_rules

    rules = OpRules(g, layout.mesh, reduce_scatter, float32_collectives, regather_weights)
    if not memo:
        each = [rules.cost_under(op, layout) for op in g.ops]
    else:
        explicit = {name for name, _ in layout.tensors}
        rep = repeats(g)
        each = []
        for i, op in enumerate(g.ops):
            j = rep[i]
            if j == i or (explicit and not explicit.isdisjoint(_names(op) + _names(g.ops[j]))):
                each.append(rules.cost_under(op, layout))
            else:
                each.append(_renamed(each[j], g.ops[j], op))
    dedupe = getattr(op_rules, "dedupe_shared", None)
    return each, (dedupe(each) if dedupe is not None else each)


__all__ = ["checked", "graph_cached", "graph_ref", "is_training_graph", "made", "op_signature", "repeats", "replaced",
           "resized", "resized_from", "signature_ids", "step_costs", "training_step"]
