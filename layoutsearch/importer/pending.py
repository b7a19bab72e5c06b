"""The graph an import is building: tensors and ops over labels, turned into an IR graph at the end.

Dims are labels (:mod:`layoutsearch.importer.labels`) until every axis of the program has been seen;
:meth:`PendingGraph.build` names them and validates the result as a :class:`~layoutsearch.ir.graph.Graph`.
Before that, :meth:`PendingGraph.hoist_renames` moves each rename (a reshape giving a dim another name,
made where an operand meets an axis of its own name, as attention's keys meet the queries' sequence) up
through the einsums and elementwise ops that only feed it, to where the value branches, and merges equal
renames: one rename of the attention input for the keys and the values, as a model written by hand has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from layoutsearch.importer.labels import Labels
from layoutsearch.ir import ops as O
from layoutsearch.ir.constants import encode
from layoutsearch.ir.dims import Dim
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.names import scoped
from layoutsearch.ir.tensor import Tensor


@dataclass(frozen=True)
class DimRef:
    """A label inside an op attribute, resolved to a dim name when the graph is built."""

    id: int


@dataclass
class PendingTensor:
    labels: tuple[int, ...]
    dtype: str
    role: str


@dataclass
class PendingOp:
    """An op writing the tensor of its own name."""

    cls: type[O.Op]
    name: str
    inputs: tuple[str, ...]
    block: str | None
    attrs: dict[str, Any]


class PendingGraph:
    """Tensors and ops over labels, in the order they were made."""

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.tensors: dict[str, PendingTensor] = {}
        self.ops: list[PendingOp] = []
        self._counts: Counter[str | None] = Counter()

    def emit(self, cls: type[O.Op], stem: str, inputs: Sequence[str], labels: Sequence[int], dtype: str,
             block: str | None, **attrs: Any) -> str:
        """Add an op (named ``block/stem_N``, N counted per block so that repeated blocks get the same
        names) writing a new tensor with dims ``labels``; return its name."""
        self._counts[block] += 1
        name = scoped(block, f"{stem}_{self._counts[block]}")
        self.tensors[name] = PendingTensor(tuple(labels), dtype, "activation")
        self.ops.append(PendingOp(cls, name, tuple(inputs), block, attrs))
        return name

    # -- renames
    def _mapping(self, op: PendingOp) -> dict[int, int] | None:
        """{old root: new label} of a pure rename op, else None."""
        if op.cls is not O.Reshape:
            return None
        groups = op.attrs["groups"]
        if not all(len(src) == 1 and len(dst) == 1 for src, dst in groups):
            return None
        return {self.labels.find(src[0].id): dst[0].id for src, dst in groups}

    def hoist_renames(self, loss: str) -> None:
        """Move renames up through the einsums and elementwise ops that feed only them (see the module)."""
        find = self.labels.find
        producer = {op.name: op for op in self.ops}
        readers = Counter(t for op in self.ops for t in op.inputs)
        readers[loss] += 1
        made: dict[tuple[str, frozenset[tuple[int, int]]], str] = {}
        work = [op for op in self.ops if self._mapping(op) is not None]
        while work:
            r = work.pop()
            mapping = self._mapping(r)
            src = r.inputs[0]
            p = producer.get(src)
            if mapping is None or p is None or readers[src] != 1 or p.cls not in (O.Einsum, O.Elementwise):
                continue
            if p.cls is O.Elementwise and p.attrs["fn"] in ("fill", "dropout_mask"):
                continue
            taken = {find(a) for t in p.inputs for a in self.tensors[t].labels}
            if any(find(b) in taken for b in mapping.values()):
                continue  # an input has the new name already (or contracts it): renaming there would merge dims
            inputs = []
            for t in p.inputs:
                roots = {find(a) for a in self.tensors[t].labels}
                m = {a: b for a, b in mapping.items() if a in roots}
                if not m:
                    inputs.append(t)
                    continue
                key = (t, frozenset((a, find(b)) for a, b in m.items()))
                if key in made:  # the same rename of the same tensor: share it
                    readers[t] -= 1
                else:
                    new = self.emit(O.Reshape, "rename", [t], [m.get(find(a), a) for a in self.tensors[t].labels],
                                    self.tensors[t].dtype, p.block,
                                    groups=tuple(((DimRef(a),), (DimRef(b),)) for a, b in m.items()))
                    op = self.ops.pop()  # placed right after the value it renames, as one writes it by hand
                    self.ops.insert(self.ops.index(producer[t]) + 1 if t in producer else 0, op)
                    producer[new] = op
                    made[key] = new
                    work.append(op)
                readers[made[key]] += 1
                inputs.append(made[key])
            # p now writes r's tensor, under r's name; its old tensor and r are gone
            self.ops.remove(r)
            del self.tensors[p.name], producer[p.name], readers[src]
            p.name, p.inputs = r.name, tuple(inputs)
            producer[p.name] = p

    def prune(self, loss: str) -> None:
        """Drop the ops the loss does not read (a negation folded into a scale by the translator)."""
        needed, keep = {loss}, []
        for op in reversed(self.ops):
            if op.name in needed:
                needed.update(op.inputs)
                keep.append(op)
        self.ops = keep[::-1]

    # -- the graph
    def build(self, name: str, loss: str, meta: Mapping[str, Any],
              constants: Mapping[str, np.ndarray] | None = None) -> Graph:
        """The IR graph (dims named, tensors listed in order of first use), with ``loss`` as its loss;
        ``constants``: the values of constant tensors (kept in ``meta["constants"]`` where the graph reads them)."""
        from layoutsearch.importer.roles import name_roles  # (roles reads pending graphs)

        self.prune(loss)
        self.hoist_renames(loss)
        name_roles(self.labels, self.tensors, self.ops)
        used = {a for t in self.tensors.values() for a in t.labels}
        for op in self.ops:
            used |= {x.id for x in _refs(op.attrs)}
        names = self.labels.names(used)

        def dim_name(a: int) -> str:
            return names[self.labels.find(a)]

        order = {n: k for k, n in enumerate(dict.fromkeys(t for op in self.ops for t in (*op.inputs, op.name)))}
        tensors = [Tensor(n, tuple(Dim(dim_name(a), self.labels.size(a)) for a in t.labels), t.dtype,
                          "loss" if n == loss else t.role)
                   for n, t in sorted(self.tensors.items(), key=lambda kv: order.get(kv[0], -1)) if n in order]
        ops = [op.cls(name=op.name, inputs=op.inputs, output=op.name, block=op.block,
                      **_resolve(op.attrs, dim_name)) for op in self.ops]
        meta = dict(meta)
        used_constants = {n: encode(v) for n, v in (constants or {}).items() if n in order}
        if used_constants:
            meta["constants"] = used_constants
        return Graph(name, tensors, ops, loss=loss, meta=meta)


def _refs(x: Any) -> list[DimRef]:
    if isinstance(x, DimRef):
        return [x]
    if isinstance(x, Mapping):
        return [y for v in x.values() for y in _refs(v)]
    if isinstance(x, tuple | list):
        return [y for v in x for y in _refs(v)]
    return []


def _resolve(x: Any, name: Callable[[int], str]) -> Any:
    if isinstance(x, DimRef):
        return name(x.id)
    if isinstance(x, Mapping):
        return {k: _resolve(v, name) for k, v in x.items()}
    if isinstance(x, tuple | list):
        return tuple(_resolve(v, name) for v in x)
    return x
