"""The validated graph: tensors, ops, and the DAG between them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

from layoutsearch.errors import GraphError
from layoutsearch.ir.dims import MAX_GRAPH_ELEMENTS, Dim, short_repr
from layoutsearch.ir.ops import Op
from layoutsearch.ir.tensor import SOURCE_ROLES, Tensor


class Graph:
    """An immutable, validated DAG of named-dim ops.

    Construction checks everything a consumer relies on: each dim name has one
    size, every tensor an op reads exists and is either fed in (role input,
    parameter or optimizer_state) or produced by exactly one op (a produced
    tensor with a source role is the new value of the tensor it ``updates``,
    e.g. ``new/w`` for ``w`` in a training graph), op semantics
    (see each op's ``check``), and the absence of cycles.

    ``ops`` are kept in a topological order (the builder's order when valid).
    ``loss`` names the scalar loss of a forward graph; ``meta`` holds the
    model's configuration (free-form, JSON-serializable).
    """

    def __init__(self, name: str, tensors: Iterable[Tensor], ops: Iterable[Op],
                 loss: str | None = None, meta: Mapping[str, Any] | None = None) -> None:
        if not isinstance(name, str) or not name.isprintable():
            raise GraphError(f"a graph's name must be a string of printable characters, got {short_repr(name)}")
        if loss is not None and not isinstance(loss, str):
            raise GraphError(f"graph {name!r}: loss must be a tensor name or None, got {short_repr(loss)}")
        if meta is not None and not isinstance(meta, Mapping):
            raise GraphError(f"graph {name!r}: meta must be a mapping, got {type(meta).__name__}")
        self.name = name
        self.tensors: dict[str, Tensor] = {}
        for t in tensors:
            if not isinstance(t, Tensor):
                raise GraphError(f"graph {name!r}: tensors must be Tensor objects, got {short_repr(t)}")
            if t.name in self.tensors:
                raise GraphError(f"tensor {t.name!r} is defined twice")
            self.tensors[t.name] = t
        self.loss = loss
        self.meta: dict[str, Any] = dict(meta or {})
        self.dims = self._check_dims()
        op_list = list(ops)
        self._producer: dict[str, Op] = {}
        names: set[str] = set()
        for op in op_list:
            if not isinstance(op, Op):
                raise GraphError(f"graph {name!r}: ops must be Op objects, got {short_repr(op)}")
            if op.name in names:
                raise GraphError(f"op name {op.name!r} is used twice")
            names.add(op.name)
            for t in (*op.inputs, op.output):
                if t not in self.tensors:
                    raise GraphError(f"{op.kind} op {op.name!r} uses unknown tensor {t!r}")
            if op.output in self._producer:
                raise GraphError(f"tensor {op.output!r} is produced by two ops: "
                                 f"{self._producer[op.output].name!r} and {op.name!r}")
            if self.tensors[op.output].role in SOURCE_ROLES and self.tensors[op.output].updates is None:
                raise GraphError(f"op {op.name!r} writes {op.output!r}, which has role "
                                 f"{self.tensors[op.output].role!r} and must be fed in, not produced "
                                 "(a new value of a parameter or state names it in `updates`)")
            self._producer[op.output] = op
            op.check(self.tensors)
        for t in self.tensors.values():
            if t.role not in SOURCE_ROLES and t.name not in self._producer:
                raise GraphError(f"tensor {t.name!r} (role {t.role}) is produced by no op")
            if t.updates is not None:
                if t.updates not in self.tensors:
                    raise GraphError(f"tensor {t.name!r} updates unknown tensor {t.updates!r}")
                old = self.tensors[t.updates]
                if t.name not in self._producer or old.name in self._producer:
                    raise GraphError(f"tensor {t.name!r} updates {old.name!r}: the new value must be produced "
                                     "by an op and the old one fed in")
                if (t.dims, t.dtype) != (old.dims, old.dtype):
                    raise GraphError(f"tensor {t.name!r} updates {old.name!r} but differs in dims or dtype")
        if loss is not None:
            if loss not in self.tensors:
                raise GraphError(f"loss tensor {loss!r} does not exist")
            if self.tensors[loss].dims:
                raise GraphError(f"loss tensor {loss!r} must be a scalar, has dims {list(self.tensors[loss].dim_names)}")
        self.ops: tuple[Op, ...] = tuple(self._topological(op_list))
        self._op_by_name = {op.name: op for op in self.ops}
        if all(op.phase == "forward" for op in self.ops):
            self.check_size()
        self._check_training_meta()

    def _check_training_meta(self) -> None:
        """``meta["training"]``, read by the cost model and the backend: an object with an optional
        ``optimizer`` object of a known ``kind``, a ``precision`` string (or null) and ``master_weights``
        mapping parameters to their optimizer-state copies (see :mod:`layoutsearch.ir.training`)."""
        if "training" not in self.meta:
            return
        from layoutsearch.ir.training import OPTIMIZERS  # training imports this module

        where = f"graph {self.name!r}: meta.training"
        training = self.meta["training"]
        if not isinstance(training, Mapping):
            raise GraphError(f"{where} must be an object, got {short_repr(training)}")
        opt = training.get("optimizer", {})
        if not isinstance(opt, Mapping) or opt.get("kind", "adam") not in OPTIMIZERS:
            raise GraphError(f"{where}.optimizer must be an object whose kind is one of {', '.join(OPTIMIZERS)}, "
                             f"got {short_repr(opt)}")
        precision = training.get("precision")
        if precision is not None and not isinstance(precision, str):
            raise GraphError(f"{where}.precision must be a string or null, got {short_repr(precision)}")
        masters = training.get("master_weights") or {}
        if not isinstance(masters, Mapping):
            raise GraphError(f"{where}.master_weights must be an object, got {short_repr(masters)}")
        for p, m in masters.items():
            param, master = self.tensors.get(p), self.tensors.get(m) if isinstance(m, str) else None
            if param is None or param.role != "parameter" or p in self._producer:
                raise GraphError(f"{where}.master_weights: {short_repr(p)} is not a parameter of the graph")
            if master is None or master.role != "optimizer_state" or master.dims != param.dims \
                    or m in self._producer:
                raise GraphError(f"{where}.master_weights: the master copy of {p!r} must be a fed optimizer_state "
                                 f"tensor with its dims, got {short_repr(m)}")

    def weighted_elements(self) -> int:
        """The sum over the tensors of their elements times one plus the number of times ops read them (an
        op reading a tensor twice counts twice): the elements the graph's ops read, plus those of its tensors.
        Bounded by :data:`~layoutsearch.ir.dims.MAX_GRAPH_ELEMENTS` (see :meth:`check_size`)."""
        readers = dict.fromkeys(self.tensors, 1)
        for op in self.ops:
            for t in op.inputs:
                readers[t] += 1
        return sum(t.num_elements * readers[t.name] for t in self.tensors.values())

    def check_size(self) -> None:
        """Raise GraphError if :meth:`weighted_elements` exceeds ``MAX_GRAPH_ELEMENTS`` (``2**56``). Checked
        on construction for forward graphs (every op of phase ``forward``) and by the graph file reader for
        every graph; the training step derived from a graph within the bound is not checked again (it holds
        at most 15 times as many elements: see ``docs/graph-format.md``, "Validation rules")."""
        n = self.weighted_elements()
        if n > MAX_GRAPH_ELEMENTS:
            raise GraphError(f"graph {self.name!r} is too large: its tensors hold {n:,} elements, counted once "
                             f"plus once per read by an op, more than the limit of 2**56 ({MAX_GRAPH_ELEMENTS:,})")

    # -- construction helpers
    def _check_dims(self) -> dict[str, int]:
        sizes: dict[str, tuple[int, str]] = {}
        for t in self.tensors.values():
            for d in t.dims:
                if d.name in sizes and sizes[d.name][0] != d.size:
                    size, other = sizes[d.name]
                    raise GraphError(f"dim {d.name!r} has two sizes: {size} in tensor {other!r} "
                                     f"and {d.size} in tensor {t.name!r}")
                sizes.setdefault(d.name, (d.size, t.name))
        return {n: s for n, (s, _) in sizes.items()}

    def _topological(self, ops: list[Op]) -> list[Op]:
        """``ops`` in the topological order closest to theirs (each next op the earliest given whose inputs
        are produced): theirs when it is one already (as every builder and derivation writes them)."""
        done: set[str] = set()
        producer = self._producer
        for op in ops:
            if any(t in producer and producer[t].name not in done for t in op.inputs):
                break
            done.add(op.name)
        else:
            return ops
        import networkx as nx  # (only for a graph whose ops come out of order: most never need it)

        g = nx.DiGraph()
        index = {op.name: i for i, op in enumerate(ops)}
        g.add_nodes_from(index)
        for op in ops:
            for t in op.inputs:
                if t in self._producer:
                    g.add_edge(self._producer[t].name, op.name)
        try:
            order = list(nx.lexicographical_topological_sort(g, key=index.__getitem__))
        except nx.NetworkXUnfeasible:
            cycle = nx.find_cycle(g)
            raise GraphError("graph has a cycle: " + " -> ".join(a for a, _ in cycle) + f" -> {cycle[0][0]}") from None
        by_name = {op.name: op for op in ops}
        return [by_name[n] for n in order]

    # -- queries
    def dim(self, name: str) -> Dim:
        """The dim called ``name``; GraphError naming the known dims otherwise."""
        if name not in self.dims:
            raise GraphError(f"unknown dim {name!r} (graph {self.name!r} has: {', '.join(sorted(self.dims))})")
        return Dim(name, self.dims[name])

    def op(self, name: str) -> Op:
        return self._op_by_name[name]

    def producer(self, tensor: str) -> Op | None:
        """The op writing ``tensor``, or None for a fed-in tensor."""
        return self._producer.get(tensor)

    @cached_property
    def consumers(self) -> dict[str, tuple[Op, ...]]:
        """Tensor name -> the ops reading it, in topological order."""
        out: dict[str, list[Op]] = {t: [] for t in self.tensors}
        for op in self.ops:
            for t in dict.fromkeys(op.inputs):
                out[t].append(op)
        return {t: tuple(v) for t, v in out.items()}

    def with_sizes(self, sizes: Mapping[str, int], ops: Iterable[Op] | None = None) -> Graph:
        """The same graph with some dims resized (e.g. ``{"batch": 4}`` for one
        micro-batch); ``meta`` entries named like a resized dim follow it. ``ops``: instead of the graph's
        (the same ops, an attribute that depends on the sizes recomputed)."""
        for d in sizes:
            self.dim(d)
        new = {d: Dim(d, sizes.get(d, s)) for d, s in self.dims.items()}
        shapes: dict[tuple[str, ...], tuple[Dim, ...]] = {}  # (tensors share their dims: each shape once)
        tensors = []
        for t in self.tensors.values():
            shape = shapes.get(t.dim_names)
            if shape is None:
                shape = shapes[t.dim_names] = tuple(new[d] for d in t.dim_names)
            tensors.append(Tensor(t.name, shape, t.dtype, t.role, t.updates))
        meta = {k: (sizes[k] if k in sizes and isinstance(v, int) else v) for k, v in self.meta.items()}
        return Graph(self.name, tensors, self.ops if ops is None else ops, loss=self.loss, meta=meta)

    def tensors_with_role(self, *roles: str) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role in roles]

    @property
    def fed(self) -> list[Tensor]:
        """The tensors fed in to run the graph (inputs, parameters, optimizer state; not their new values)."""
        return [t for t in self.tensors.values() if t.role in SOURCE_ROLES and t.name not in self._producer]

    @property
    def parameters(self) -> list[Tensor]:
        """The trainable parameters (fed in; their new values ``updates``-ing them are left out)."""
        return list(self._parameters)

    @cached_property
    def _parameters(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors_with_role("parameter") if t.name not in self._producer)

    @property
    def inputs(self) -> list[Tensor]:
        return self.tensors_with_role("input")

    def summary(self) -> dict[str, Any]:
        """JSON-ready: dims, tensor and op counts (ops by kind), inputs, loss, parameters with their shapes and
        bytes, and their totals."""
        ops: dict[str, int] = {}
        for op in self.ops:
            ops[op.kind] = ops.get(op.kind, 0) + 1
        params = [{"name": t.name, "shape": {d.name: d.size for d in t.dims}, "dtype": t.dtype,
                   "elements": t.num_elements, "bytes": t.nbytes} for t in self.parameters]
        return {
            "model": self.name, "dims": dict(self.dims), "tensors": len(self.tensors), "ops": len(self.ops),
            "ops_by_kind": ops, "inputs": [{"name": t.name, "shape": {d.name: d.size for d in t.dims},
                                            "dtype": t.dtype} for t in self.inputs],
            "loss": self.loss, "parameters": params,
            "parameter_count": sum(p["elements"] for p in params), "parameter_bytes": sum(p["bytes"] for p in params),
            "meta": self.meta,
        }

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.tensors)} tensors, {len(self.ops)} ops)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (self.name, self.tensors, self.ops, self.loss, self.meta) == (
            other.name, other.tensors, other.ops, other.loss, other.meta)

    __hash__ = None  # type: ignore[assignment]
