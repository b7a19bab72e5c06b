"""Translation of shape and indexing primitives: transposes and broadcasts (relabelled axes, no op),
reshapes (a reshape op when dims split or merge), static slices, splits and concatenations (parts of function
arguments as tensors of their own, slice and concat ops of computed values), scan iterations and gathers of
whole table rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layoutsearch.importer.pending import DimRef, PendingTensor
from layoutsearch.importer.trace import Const, Lit, Node, Operand
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
                parts = self._split_label(gi[0][0], [out.shape[k] for k in gj])
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

    def _split_label(self, a: int, sizes: list[int]) -> list[int]:
        base = self.labels.base(a)
        names = self.splits.get(base, tuple(f"{base}_{k}" for k in range(len(sizes))))
        if len(names) != len(sizes):
            raise self.unsupported(f"splits[{base!r}] names {len(names)} dims, the reshape makes {len(sizes)}")
        if base not in self.splits and self.labels.name(a) is None:  # parts of a placeholder: placeholders too
            return [self.labels.placeholder(s, n) for n, s in zip(names, sizes, strict=True)]
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
        return self._static_slice(node.ins[0], starts, node.outs[0].shape)

    def _dynamic_slice(self, node: Node) -> Val:
        if not all(isinstance(i, Lit | Const) for i in node.ins[1:]):
            raise self.unsupported("a dynamic slice at a computed index")
        starts = tuple(int(np.asarray(i.value).reshape(-1)[0]) for i in node.ins[1:])  # type: ignore[union-attr]
        src, shape = node.ins[0], node.outs[0].shape
        starts = tuple(min(max(a, 0), n - m) for a, n, m in zip(starts, src.shape, shape, strict=True))  # XLA clamps
        return self._static_slice(src, starts, shape)

    def _dynamic_update_slice(self, node: Node) -> Val:
        """``lax.dynamic_update_slice`` at constant offsets: see :meth:`_update_window`."""
        src, upd, *idx = node.ins
        if not all(isinstance(i, Lit | Const) for i in idx):
            raise self.unsupported("a dynamic update at a computed index")
        starts = [int(np.asarray(i.value).reshape(-1)[0]) for i in idx]  # type: ignore[union-attr]
        return self._update_window(src, self.val(upd), tuple(upd.shape), starts)

    def _scatter(self, node: Node) -> Val:
        """``x.at[..., i, ...].set(update)`` at one constant index vector: an update of one window."""
        src, idx, upd = node.ins
        dn = node.params["dimension_numbers"]
        if not isinstance(idx, Const) or int(np.prod(idx.shape[:-1] or (1,))) != 1 or dn.operand_batching_dims or (
                node.params.get("update_jaxpr") is not None):
            raise self.unsupported("a scatter other than a set at one constant index (x.at[i].set(u))")
        starts = [0] * len(src.shape)
        for axis, i in zip(dn.scatter_dims_to_operand_dims, np.asarray(idx.value).reshape(-1), strict=True):
            starts[axis] = int(i)
        v = self.val(upd)  # one index vector: every axis of the update is a window axis, in the operand's order
        if len(v.labels) + len(dn.inserted_window_dims) != len(src.shape):
            raise self.unsupported("a scatter whose update has batch axes")
        labels, sizes = iter(v.labels), iter(upd.shape)
        full = [None if k in dn.inserted_window_dims else next(labels) for k in range(len(src.shape))]
        shape = [1 if k in dn.inserted_window_dims else next(sizes) for k in range(len(src.shape))]
        return self._update_window(src, self._val(v.tensor, full), tuple(shape), starts)

    def _update_window(self, src: Operand, u: Val, shape: tuple[int, ...], starts: list[int]) -> Val:
        """``src`` with the window of ``shape`` at ``starts`` (clamped into range, as XLA does) replaced by ``u``:
        the update padded out to the operand's dims (a pad op per cut axis), selected inside the window by a
        constant 0/1 mask, the operand outside."""
        starts = [min(max(a, 0), n - m) for a, n, m in zip(starts, src.shape, shape, strict=True)]
        x = self.dense(self.val(src))
        u = self.dense(u)
        dtype = self.dtype(x)
        if self.dtype(u) != dtype:
            raise self.unsupported("an update of another dtype than its operand")
        whole = [a if src.shape[i] == shape[i] else b for i, (a, b) in enumerate(zip(x.labels, u.labels, strict=True))]
        u = self.dense(self.conform(u, whole))
        for i, (n, m) in enumerate(zip(src.shape, shape, strict=True)):
            if n == m:
                continue
            if u.labels[i] is None:  # one index: a size-1 axis to pad along
                one = list(u.labels)
                one[i] = self.labels.placeholder(1, self.labels.base(x.labels[i]))
                u = self.emit(O.Elementwise, "broadcast", [u.tensor], one, dtype, fn="identity")
            out = [x.labels[i] if k == i else a for k, a in enumerate(u.labels)]
            u = self.emit(O.Pad, "pad", [u.tensor], out, dtype, dim=DimRef(u.labels[i]), start=starts[i],
                          out_dim=DimRef(x.labels[i]))
        assert self.node is not None
        mask = np.ones(src.shape, np.float32)
        mask[tuple(slice(a, a + m) for a, m in zip(starts, shape, strict=True))] = 0.0
        keep = self.dense(self.conform(self.constant(Const(mask, self.node.where)), x.labels))
        return self.emit(O.Elementwise, "update", [keep.tensor, x.tensor, u.tensor], x.labels, dtype, fn="where")

    def _split(self, node: Node) -> None:
        """``jnp.split`` (the fused q, k, v of GPT-2's ``c_attn``): one slice per part."""
        axis, at = node.params["axis"], 0
        src = node.ins[0]
        for out, n in zip(node.outs, node.params["sizes"], strict=True):
            starts = tuple(at if k == axis else 0 for k in range(len(src.shape)))
            self.vals[out] = self._static_slice(src, starts, out.shape)
            at += n

    def _static_slice(self, src: Operand, starts: tuple[int, ...], shape: Sequence[int]) -> Val:
        """A static slice: the value itself when whole; of a function argument, a source tensor of its own
        (``pos_embed[0:16, 0:512]``: the rows a model reads of a longer table), whose cut axes take the
        name of the axes they meet (placeholders named after the argument's dim); of a computed value, a
        slice op per cut axis (along an axis the value is broadcast on, no op)."""
        v = self.val(src)
        if tuple(src.shape) == tuple(shape):
            return v
        t = self.tensors[v.tensor]
        labels = [a if a is None or src.shape[i] == shape[i] else
                  self.labels.placeholder(shape[i], self.labels.base(a)) if shape[i] != 1 else None
                  for i, a in enumerate(v.labels)]
        if t.role != "activation":
            bounds = ", ".join(f"{a}:{a + n}" for a, n in zip(starts, shape, strict=True))
            return self._source_view(f"{v.tensor}[{bounds}]", labels, t)
        stored = self.stored(v)
        for i, (a, new) in enumerate(zip(v.labels, labels, strict=True)):
            if a is None or new == a:
                continue
            cut = list(v.labels)
            cut[i] = new
            if self.labels.find(a) not in stored:  # a broadcast axis: every index holds the same values
                v = self._val(v.tensor, cut)
                continue
            one = self.labels.placeholder(1, self.labels.base(a)) if new is None else new
            out = tuple(one if self.labels.find(b) == self.labels.find(a) else b for b in self.tensors[v.tensor].labels)
            s = self.emit(O.Slice, "slice", [v.tensor], out, self.dtype(v), dim=DimRef(a), start=int(starts[i]),
                          out_dim=DimRef(one))
            if new is None:  # one index of the axis: its slice of size 1 summed away (the axis dropped)
                s = self.emit(O.Reduce, "take", [s.tensor], [b for b in out if b != one], self.dtype(v), fn="sum")
            v = self._val(s.tensor, cut)
            stored = self.stored(v)
        return v

    def _concatenate(self, node: Node) -> Val:
        """``jnp.concatenate`` (``rotate_half``'s ``[-x2, x1]``, a prefix joined to a sequence): the parts laid
        end to end along a new dim; the parts' other axes paired by position."""
        axis, out = node.params["dimension"], node.outs[0]
        parts = [self.dense(self.val(o)) for o in node.ins if o.shape[axis] != 0]
        if len(parts) == 1:
            return parts[0]
        if any(p.labels[axis] is None for p in parts):
            raise self.unsupported("a concatenation of parts of size 1 along the joined axis")
        labels = list(parts[0].labels)
        for p in parts[1:]:
            labels = [a if a is not None else b for a, b in zip(labels, p.labels, strict=True)]
        labels[axis] = self.labels.placeholder(out.shape[axis], self.labels.base(parts[0].labels[axis]))
        ins, dims = [], []
        for p in parts:
            want = [p.labels[axis] if k == axis else a for k, a in enumerate(labels)]
            q = self.dense(self.conform(p, want))
            ins.append(q.tensor)
            dims.append(DimRef(q.labels[axis]))
        dtype = self.dtype(parts[0])
        return self.emit(O.Concat, "concat", ins, labels, dtype, dims=tuple(dims), out_dim=DimRef(labels[axis]))

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
        """A gather of whole rows along one axis: ``table[ids]`` / ``jnp.take`` (the ids' axes first), and with
        batching axes ``jnp.take_along_axis`` (the ids and the table share those dims); constant ids of one
        value are a static slice, constant ids ``a .. a+n-1`` a slice of a function argument."""
        table_v, ids_v = node.ins
        dn, sizes = node.params["dimension_numbers"], node.params["slice_sizes"]
        t_batch = tuple(getattr(dn, "operand_batching_dims", ()))
        i_batch = tuple(getattr(dn, "start_indices_batching_dims", ()))
        if len(dn.start_index_map) != 1 or ids_v.shape[-1:] != (1,) or not set(dn.collapsed_slice_dims) <= set(
                dn.start_index_map):
            raise self.unsupported("a gather other than whole rows of a table (table[ids], take_along_axis)")
        axis = dn.start_index_map[0]
        if any(s != (1 if k == axis or k in t_batch else table_v.shape[k]) for k, s in enumerate(sizes)):
            raise self.unsupported("a gather of partial rows")
        out_shape = node.outs[0].shape
        offset = list(dn.offset_dims)
        batch = [d for d in range(len(out_shape)) if d not in offset]
        kept = [k for k in range(len(table_v.shape)) if k not in t_batch and k not in dn.collapsed_slice_dims]
        if isinstance(ids_v, Const) and not t_batch and (c := ids_v.uniform()) is not None:
            start = min(max(int(c.value), 0), table_v.shape[axis] - 1)  # one row for every id (clamped, as XLA)
            row = self._static_slice(table_v, tuple(start if k == axis else 0 for k in range(len(table_v.shape))),
                                     [1 if k == axis else n for k, n in enumerate(table_v.shape)])
            labels: list[int | None] = [None] * len(out_shape)
            for d, k in zip(offset, kept, strict=True):
                labels[d] = row.labels[k]
            for d in batch:
                labels[d] = None if out_shape[d] == 1 else self.labels.placeholder(out_shape[d], f"dim{out_shape[d]}")
            return self._val(row.tensor, labels)
        ids = self.as_ids(self.val(ids_v))
        id_labels = list(ids.labels[:-1])
        if isinstance(ids_v, Const) and not t_batch and (
                view := self._rows_view(self.val(table_v), axis, ids)) is not None:
            rows_label = view.labels[axis]  # constant ids a..a+n-1 (positions): rows a..a+n-1, a slice
            table, gathered = view, None
            id_labels = [rows_label if a is not None and self.labels.find(a) in self.stored(ids) else a
                         for a in id_labels]
        else:
            table, gathered = self.dense(self.val(table_v)), ids
        shared = dict(zip(i_batch, t_batch, strict=True))  # ids axis -> table axis (take_along_axis)
        id_labels = [table.labels[shared[j]] if j in shared else a for j, a in enumerate(id_labels)]
        labels = [None] * len(out_shape)
        for d, k in zip(offset, kept, strict=True):
            labels[d] = None if k == axis else table.labels[k]
        for d, a in zip(batch, id_labels, strict=True):
            labels[d] = a
        if gathered is None:
            return self._val(table.tensor, labels)
        labels = self.distinct(labels) if not shared else labels
        ids = self.conform(self.dense(self._val(ids.tensor, list(ids.labels[:-1]))), [labels[d] for d in batch])
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
