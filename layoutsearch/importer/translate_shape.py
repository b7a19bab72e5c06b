"""Translation of shape and indexing primitives: transposes and broadcasts (relabelled axes, no op),
reshapes (a reshape op when dims split or merge), static slices and scan iterations (parts of function
arguments as tensors of their own) and gathers of whole table rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layoutsearch.importer.pending import DimRef, PendingTensor
from layoutsearch.importer.trace import Const, Lit, Node
from layoutsearch.importer.translate_base import TranslatorBase, Val
from layoutsearch.ir import ops as O


class ShapeRules(TranslatorBase):
    """The rules for shape and indexing primitives."""

    # -- shape ops
    def _transpose(self, node: Node) -> Val:
        v = self.val(node.ins[0])
        labels = [v.labels[p] for p in node.params["permutation"]]
        t = self.tensors[v.tensor]
        if t.role == "activation" and len(t.labels) == sum(a is not None for a in labels):
            t.labels = tuple(a for a in labels if a is not None)  # store it in the order it is read
        return self._val(v.tensor, labels)

    def _broadcast_in_dim(self, node: Node) -> Val:
        src, out = node.ins[0], node.outs[0]
        if isinstance(src, Lit):
            raise self.unsupported("a constant array (broadcast of a scalar): pass it as an argument")
        v = self.val(src)
        labels: list[int | None] = [None] * len(out.shape)
        for i, d in enumerate(node.params["broadcast_dimensions"]):
            if src.shape[i] == out.shape[d]:
                labels[d] = v.labels[i]
        for d, size in enumerate(out.shape):
            if labels[d] is None and size != 1:
                labels[d] = self.labels.placeholder(size, f"dim{size}")
        return self._val(v.tensor, labels)

    def _reshape(self, node: Node) -> Val:
        src, out = node.ins[0], node.outs[0]
        v = self.dense(self.val(src))
        ins = [(a, s) for a, s in zip(v.labels, src.shape, strict=True) if s != 1 or a is not None]
        outs = [i for i, s in enumerate(out.shape) if s != 1]
        labels: list[int | None] = [None] * len(out.shape)
        groups: list[tuple[tuple[DimRef, ...], tuple[DimRef, ...]]] = []
        i = j = 0
        while i < len(ins) or j < len(outs):
            gi, gj = [ins[i]] if i < len(ins) else [], [outs[j]] if j < len(outs) else []
            if not gi or not gj:
                if all(s == 1 for _, s in gi):  # a named size-1 dim dropped
                    i += len(gi)
                    j += len(gj)
                    continue
                raise self.unsupported("a reshape the importer cannot group")
            pi, pj = gi[0][1], out.shape[gj[0]]
            i, j = i + 1, j + 1
            while pi != pj:
                if pi < pj and i < len(ins):
                    gi.append(ins[i])
                    pi *= ins[i][1]
                    i += 1
                elif pj < pi and j < len(outs):
                    gj.append(outs[j])
                    pj *= out.shape[outs[j]]
                    j += 1
                else:
                    raise self.unsupported("a reshape the importer cannot group")
            if len(gi) == 1 and len(gj) == 1:
                labels[gj[0]] = gi[0][0]
            elif len(gj) == 1:
                labels[gj[0]] = self._merged([a for a, _ in gi if a is not None], out.shape[gj[0]])
                groups.append((tuple(DimRef(a) for a, _ in gi if a is not None), (DimRef(labels[gj[0]]),)))
            elif len(gi) == 1 and gi[0][0] is not None:
                parts = self._split(gi[0][0], [out.shape[k] for k in gj])
                for k, a in zip(gj, parts, strict=True):
                    labels[k] = a
                groups.append(((DimRef(gi[0][0]),), tuple(DimRef(a) for a in parts)))
            else:
                raise self.unsupported("a reshape that regroups several dims into several others")
        if not groups:
            return self._val(v.tensor, labels)
        return self.emit(O.Reshape, "reshape", [v.tensor], labels, self.dtype(v), groups=tuple(groups))

    def _merged(self, parts: list[int], size: int) -> int:
        name = "_".join(self.labels.base(a) for a in parts)
        if all(self.labels.name(a) for a in parts):
            return self.labels.named(name, size)
        return self.labels.placeholder(size, name)

    def _split(self, a: int, sizes: list[int]) -> list[int]:
        base = self.labels.base(a)
        names = self.splits.get(base, tuple(f"{base}_{k}" for k in range(len(sizes))))
        if len(names) != len(sizes):
            raise self.unsupported(f"splits[{base!r}] names {len(names)} dims, the reshape makes {len(sizes)}")
        return [self.labels.named(n, s) for n, s in zip(names, sizes, strict=True)]

    def _squeeze(self, node: Node) -> Val:
        v = self.val(node.ins[0])
        dims = set(node.params["dimensions"])
        return self._val(v.tensor, [a for i, a in enumerate(v.labels) if i not in dims])

    def _expand_dims(self, node: Node) -> Val:
        return self._reshape(node)

    def _slice(self, node: Node) -> Val:
        starts = tuple(int(x) for x in node.params["start_indices"])
        if any(st not in (None, 1) for st in node.params.get("strides") or ()):
            raise self.unsupported("a strided slice")
        return self._static_slice(node, starts)

    def _dynamic_slice(self, node: Node) -> Val:
        if not all(isinstance(i, Lit) for i in node.ins[1:]):
            raise self.unsupported("a dynamic slice at a computed index")
        return self._static_slice(node, tuple(int(i.value) for i in node.ins[1:]))  # type: ignore[union-attr]

    def _static_slice(self, node: Node, starts: tuple[int, ...]) -> Val:
        """A static slice: the value itself when whole; of a function argument, a source tensor of its own
        (``pos_embed[0:16, 0:512]``: the rows a model reads of a longer table), whose cut axes take the
        name of the axes they meet (placeholders named after the argument's dim)."""
        src, out = node.ins[0], node.outs[0]
        v = self.val(src)
        if tuple(src.shape) == tuple(out.shape):
            return v
        t = self.tensors[v.tensor]
        if t.role == "activation":
            raise self.unsupported("a partial slice of a computed value (only slices of function arguments "
                                   "or whole arrays import)")
        bounds = ", ".join(f"{a}:{a + n}" for a, n in zip(starts, out.shape, strict=True))
        labels = [a if a is None or src.shape[i] == out.shape[i] else
                  self.labels.placeholder(out.shape[i], self.labels.base(a)) if out.shape[i] != 1 else None
                  for i, a in enumerate(v.labels)]
        return self._source_view(f"{v.tensor}[{bounds}]", labels, t)

    def _index(self, node: Node) -> Val:
        """Iteration ``i`` of a scan reads slice ``i`` of a stacked input: a source tensor of its own."""
        v = self.val(node.ins[0])
        t = self.tensors[v.tensor]
        if t.role == "activation" or v.labels[0] is None and node.ins[0].shape[0] != 1:
            raise self.unsupported("a scan over a computed array (only function arguments can be scanned)")
        return self._source_view(f"{v.tensor}[{node.params['index']}]", v.labels[1:], t)

    def _source_view(self, name: str, labels: Sequence[int | None], of: PendingTensor) -> Val:
        """The source tensor ``name`` (a part of source ``of``), made on first use."""
        if name not in self.views:
            self.tensors[name] = PendingTensor(tuple(a for a in labels if a is not None), of.dtype, of.role)
            self.views[name] = self._val(name, labels)
        return self.views[name]

    def _stack(self, node: Node) -> Val:
        raise self.unsupported("a scan's stacked outputs (the importer keeps only the carry)")

    def _gather(self, node: Node) -> Val:
        table_v, ids_v = node.ins
        dn, sizes = node.params["dimension_numbers"], node.params["slice_sizes"]
        if (len(dn.start_index_map) != 1 or tuple(dn.collapsed_slice_dims) != tuple(dn.start_index_map)
                or getattr(dn, "operand_batching_dims", ()) or ids_v.shape[-1:] != (1,)):
            raise self.unsupported("a gather other than whole rows of a table (table[ids])")
        axis = dn.start_index_map[0]
        if any(s != (1 if k == axis else table_v.shape[k]) for k, s in enumerate(sizes)):
            raise self.unsupported("a gather of partial rows")
        ids = self.val(ids_v)
        id_labels = list(ids.labels[:-1])
        out_shape = node.outs[0].shape
        offset = list(dn.offset_dims)
        batch = [d for d in range(len(out_shape)) if d not in offset]
        if isinstance(ids_v, Const) and (view := self._rows_view(self.val(table_v), axis, ids)) is not None:
            rows_label = view.labels[axis]  # constant ids a..a+n-1 (positions): rows a..a+n-1, a slice
            table, gathered = view, None
            id_labels = [rows_label if a is not None and self.labels.find(a) in self.stored(ids) else a
                         for a in id_labels]
        else:
            table, gathered = self.dense(self.val(table_v)), ids
        rows = [a for k, a in enumerate(table.labels) if k != axis]
        labels: list[int | None] = [None] * len(out_shape)
        for d, a in zip(offset, rows, strict=True):
            labels[d] = a
        for d, a in zip(batch, id_labels, strict=True):
            labels[d] = a
        if gathered is None:
            return self._val(table.tensor, labels)
        labels = self.distinct(labels)
        ids = self.conform(self.dense(self._val(ids.tensor, id_labels)), [labels[d] for d in batch])
        return self.emit(O.Gather, "gather", [table.tensor, ids.tensor], labels, self.dtype(table),
                         dim=DimRef(self._axis_label(table, axis)))

    def _rows_view(self, table: Val, axis: int, ids: Val) -> Val | None:
        """Rows ``a .. a+n-1`` of a function argument as a tensor of its own, when constant ``ids`` are those
        numbers in order along one axis (position ids ``arange(seq)``, broadcast over the batch): the table
        read as ``pos_embed[0:16]``, its cut axis the ids' axis. None otherwise."""
        values = self.constants[ids.tensor]
        t = self.tensors[table.tensor]
        if values.ndim != 1 or t.role == "activation" or table.labels[axis] is None:
            return None
        start = int(values[0])
        if start < 0 or not np.array_equal(values, np.arange(start, start + len(values))):
            return None
        shape = [self.labels.size(a) if a is not None else 1 for a in table.labels]
        bounds = ", ".join(f"{start}:{start + len(values)}" if k == axis else f"0:{n}" for k, n in enumerate(shape))
        labels = list(table.labels)
        labels[axis] = self.tensors[ids.tensor].labels[0]
        return self._source_view(f"{table.tensor}[{bounds}]", labels, t)
