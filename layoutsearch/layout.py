"""Layouts: which named dims are split over which mesh axes.

A layout maps, per tensor, dim names to a tuple of mesh axes (major first;
one dim may span several axes, one axis splits at most one dim of a tensor).
It is built from

* global rules, Mesh-TF "computation layout" style: ``batch:data,d_ff:model``,
  several axes ``batch:data+fsdp``, no split ``d_model:`` or ``d_model:-``.
  Rules apply with Flax ``logical_axis_rules`` precedence: the dims of a
  tensor are taken in rule order, and a rule whose axes are already used by
  an earlier dim of the same tensor does not apply there (the dim falls to
  its next rule, or stays unsplit). A dim may have several rules (fallbacks);
  an unsplit rule (``d:-``) claims the dim, so later rules for it never apply.
* per-tensor entries (``Layout.with_tensor``), which take precedence and are
  checked strictly: an axis splitting two dims of the tensor is an error.

Dim names must exist in the graph, axes in the mesh, and every split must
divide the dim evenly (JAX refuses uneven splits).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from layoutsearch.errors import LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.ir.tensor import Tensor
from layoutsearch.mesh import Mesh

Axes = tuple[str, ...]
"""Mesh axes splitting one dim, major first (empty: not split)."""

DimLayout = dict[str, Axes]
"""Dim name -> the mesh axes splitting it (only split dims appear)."""

SpecEntry = None | str | tuple[str, ...]
"""One entry of a PartitionSpec: None, one axis name, or several (major first)."""


def parse_rules(text: str) -> tuple[tuple[str, Axes], ...]:
    """Parse ``batch:data,d_ff:model,embed:data+fsdp`` into ordered (dim, axes) rules."""
    rules: list[tuple[str, Axes]] = []
    if not text or not text.strip():
        return ()
    for part in text.split(","):
        if ":" not in part and "=" not in part:
            raise LayoutError(f"bad layout rule {part.strip()!r}: write 'dim:axis' or 'dim:axis1+axis2'")
        dim, _, axes = part.replace("=", ":", 1).partition(":")
        dim, axes = dim.strip(), axes.strip()
        if not dim.isidentifier():
            raise LayoutError(f"bad dim name {dim!r} in layout rule {part.strip()!r}")
        names = () if axes in ("", "-", "none", "None") else tuple(a.strip() for a in axes.split("+"))
        for a in names:
            if not a.isidentifier():
                raise LayoutError(f"bad mesh axis {a!r} in layout rule {part.strip()!r}")
        if len(set(names)) != len(names):
            raise LayoutError(f"layout rule {part.strip()!r} repeats a mesh axis")
        rules.append((dim, names))
    return tuple(rules)


def format_rules(rules: Iterable[tuple[str, Axes]]) -> str:
    """The inverse of :func:`parse_rules`."""
    return ",".join(f"{d}:{'+'.join(a) if a else '-'}" for d, a in rules)


@dataclass(frozen=True)
class Layout:
    """A layout on a mesh: global rules plus per-tensor entries.

    Use :meth:`check` against a graph before trusting per-device shapes; the
    solvers and the CLI always do.
    """

    mesh: Mesh
    rules: tuple[tuple[str, Axes], ...] = ()
    tensors: tuple[tuple[str, tuple[tuple[str, Axes], ...]], ...] = field(default=())
    _shapes: dict[Any, tuple[int, ...]] = field(default_factory=dict, init=False, repr=False, compare=False,
                                                hash=False)
    """Per-device shapes computed so far (:meth:`local_shape`), keyed by the dims of tensors the rules lay out."""
    _laid: dict[tuple[str, ...], DimLayout] = field(default_factory=dict, init=False, repr=False, compare=False,
                                                    hash=False)
    """What the rules give each tuple of dims asked about so far (:meth:`rules_layout`)."""
    _overrides: dict[str, tuple[tuple[str, Axes], ...]] = field(default_factory=dict, init=False, repr=False,
                                                                compare=False, hash=False)
    """The per-tensor entries by tensor name (the first entry of a name counts, as in :attr:`tensors`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple((d, tuple(a)) for d, a in self.rules))
        for name, entries in reversed(self.tensors):
            self._overrides[name] = entries
        for dim, axes in self.rules:
            for a in axes:
                self._check_axis(a, f"rule {dim}:{'+'.join(axes)}")
        for name, entries in self.tensors:
            used: dict[str, str] = {}
            for dim, axes in entries:
                for a in axes:
                    self._check_axis(a, f"tensor {name!r}")
                    if a in used:
                        raise LayoutError(f"tensor {name!r}: mesh axis {a!r} splits two dims "
                                          f"({used[a]!r} and {dim!r}); one axis splits at most one dim")
                    used[a] = dim

    def _check_axis(self, axis: str, where: str) -> None:
        if axis not in self.mesh.names:
            raise LayoutError(f"{where}: unknown mesh axis {axis!r} (mesh {self.mesh} has: {', '.join(self.mesh.names)})")

    # -- construction
    @classmethod
    def from_rules(cls, mesh: Mesh | str, rules: str | Iterable[tuple[str, Iterable[str]]] | Mapping[str, Any]) -> Layout:
        """A layout from global rules: a string, (dim, axes) pairs, or {dim: axes}."""
        m = Mesh.of(mesh)
        if isinstance(rules, str):
            parsed = parse_rules(rules)
        else:
            items = rules.items() if isinstance(rules, Mapping) else rules
            parsed = tuple((d, _axes(a)) for d, a in items)
        return cls(m, parsed)

    @classmethod
    def replicated(cls, mesh: Mesh | str) -> Layout:
        return cls(Mesh.of(mesh))

    def with_tensor(self, tensor: str, dims: Mapping[str, Any]) -> Layout:
        """A copy where ``tensor`` is laid out exactly as ``dims`` says (dim -> axes); other dims unsplit."""
        entries = tuple((d, _axes(a)) for d, a in dims.items() if _axes(a))
        rest = tuple((n, e) for n, e in self.tensors if n != tensor)
        return Layout(self.mesh, self.rules, rest + ((tensor, entries),))

    # -- queries
    def dim_layout(self, tensor: Tensor) -> DimLayout:
        """Dim name -> mesh axes for ``tensor`` (split dims only)."""
        entries = self._overrides.get(tensor.name)
        if entries is not None:
            present = set(tensor.dim_names)
            return {d: a for d, a in entries if d in present and a}
        return self.rules_layout(tensor.dim_names)

    def rules_layout(self, dims: Sequence[str]) -> DimLayout:
        """What the global rules give a set of dims (a tensor's, or an op's
        iteration space), with Flax precedence; keys follow ``dims`` order (a fresh dict, computed once per
        tuple of dims)."""
        key = tuple(dims)
        hit = self._laid.get(key)
        if hit is None:
            hit = self._laid[key] = self._rules_layout(key)
        return dict(hit)

    def _rules_layout(self, dims: tuple[str, ...]) -> DimLayout:
        out: DimLayout = {}
        used: set[str] = set()
        present = set(dims)
        decided: set[str] = set()
        for dim, axes in self.rules:
            if dim not in present or dim in decided:
                continue
            if not axes:  # an explicit "unsplit" rule claims the dim, as (dim, None) does in Flax
                decided.add(dim)
            elif used.isdisjoint(axes):
                out[dim] = axes
                used.update(axes)
                decided.add(dim)
        return {d: out[d] for d in dims if d in out}

    def spec(self, tensor: Tensor) -> tuple[SpecEntry, ...]:
        """PartitionSpec entries of ``tensor``, one per dim in order (no JAX needed)."""
        lay = self.dim_layout(tensor)
        out: list[SpecEntry] = []
        for d in tensor.dim_names:
            axes = lay.get(d, ())
            out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        return tuple(out)

    def partition_spec(self, tensor: Tensor) -> Any:
        """``jax.sharding.PartitionSpec`` of ``tensor``."""
        from jax.sharding import PartitionSpec

        return PartitionSpec(*self.spec(tensor))

    def local_shape(self, tensor: Tensor) -> tuple[int, ...]:
        """Per-device shape of ``tensor`` (assumes :meth:`check` passed)."""
        key = tensor.dims if not self.tensors else (tensor.name, tensor.dims)
        shape = self._shapes.get(key)
        if shape is None:
            lay = self.dim_layout(tensor)
            shape = self._shapes[key] = tuple(d.size // self.mesh.group_size(lay.get(d.name, ())) for d in tensor.dims)
        return shape

    def local_bytes(self, tensor: Tensor) -> int:
        """Per-device bytes of ``tensor``."""
        return math.prod(self.local_shape(tensor)) * tensor.itemsize

    def replication(self, tensor: Tensor) -> int:
        """How many devices hold each element of ``tensor`` (mesh size / shards)."""
        used = {a for axes in self.dim_layout(tensor).values() for a in axes}
        return self.mesh.group_size([a for a in self.mesh.names if a not in used])

    def tensor_table(self, graph: Graph) -> list[dict[str, Any]]:
        """JSON-ready, per tensor of ``graph``: role, dtype, shape, PartitionSpec, per-device shape and bytes,
        and replication."""
        return [{"name": t.name, "role": t.role, "dtype": t.dtype, "shape": {d.name: d.size for d in t.dims},
                 "spec": [list(s) if isinstance(s, tuple) else s for s in self.spec(t)],
                 "local_shape": list(self.local_shape(t)), "local_bytes": self.local_bytes(t),
                 "replication": self.replication(t)} for t in graph.tensors.values()]

    def local_bytes_by_role(self, graph: Graph) -> dict[str, int]:
        """Per-device bytes of ``graph``'s tensors summed by role (slices, not peak memory)."""
        out: dict[str, int] = {}
        for t in graph.tensors.values():
            out[t.role] = out.get(t.role, 0) + self.local_bytes(t)
        return out

    def restricted(self, graph: Graph) -> Layout:
        """The layout with only the per-tensor entries of tensors ``graph`` has (a per-op plan of the training
        graph lays out its backward tensors too; the forward graph a program runs lacks them)."""
        kept = tuple((n, e) for n, e in self.tensors if n in graph.tensors)
        return self if len(kept) == len(self.tensors) else Layout(self.mesh, self.rules, kept)

    def check(self, graph: Graph) -> Layout:
        """Raise LayoutError if the layout does not fit ``graph``; return self."""
        for dim, axes in self.rules:
            if dim not in graph.dims:
                raise LayoutError(f"layout rule {dim}:{'+'.join(axes) or '-'} names dim {dim!r}, which model "
                                  f"{graph.name!r} lacks (dims: {', '.join(sorted(graph.dims))})")
        for name, entries in self.tensors:
            if name not in graph.tensors:
                raise LayoutError(f"layout names tensor {name!r}, which model {graph.name!r} lacks")
            t = graph.tensors[name]
            for d, _ in entries:
                if d not in t.dim_names:
                    raise LayoutError(f"layout of tensor {name!r} names dim {d!r}; the tensor has {list(t.dim_names)}")
        for t in graph.tensors.values():
            for d, axes in self.dim_layout(t).items():
                n = self.mesh.group_size(axes)
                size = graph.dims[d]
                if size % n:
                    raise LayoutError(f"dim {d!r} of size {size} cannot be split {n} ways over "
                                      f"{'+'.join(axes)} (tensor {t.name!r}): not divisible")
        return self

    def describe(self) -> str:
        """The rules as a Mesh-TF layout string."""
        return format_rules(self.rules)

    def to_dict(self, graph: Graph | None = None) -> dict[str, Any]:
        """JSON-ready: the mesh, the ordered rules as [dim, axes] pairs, and
        (given a graph) every tensor's PartitionSpec."""
        d: dict[str, Any] = {"mesh": str(self.mesh), "rules": [[k, list(v)] for k, v in self.rules]}
        if self.tensors:
            d["overrides"] = {n: {k: list(v) for k, v in e} for n, e in self.tensors}
        if graph is not None:
            d["tensors"] = {t.name: [list(s) if isinstance(s, tuple) else s for s in self.spec(t)]
                            for t in graph.tensors.values()}
        return d


AXIS_ROLES: dict[str, tuple[str, ...]] = {
    "data": ("data", "dp", "replica", "batch", "dcn", "slice"),
    "fsdp": ("fsdp", "zero", "sharded"),
    "seq": ("seq", "sequence", "sp", "context", "cp"),
    "model": ("model", "tensor", "tp", "mp"),
    "expert": ("expert", "experts", "ep"),
}
"""Conventional mesh-axis names and the parallelism they stand for (MaxText, Megatron-LM, Alpa usage)."""

CONVENTIONAL_DIMS: dict[str, tuple[str, ...]] = {
    "model": ("heads", "kv_heads", "q_per_kv", "d_ff", "vocab"),
    "expert": ("experts",),
}
"""Model dims a tensor-parallel (Megatron) or expert axis splits."""


def conventional_rules(graph: Graph, mesh: Mesh, stage_axis: str | None = None,
                       notes: list[str] | None = None) -> str:
    """The layout practitioners write for ``mesh`` by its axis names (:data:`AXIS_ROLES`), as rules for
    ``graph``'s dims: data and FSDP axes split ``batch``; FSDP axes also split ``d_model`` (parameters,
    gradients and optimizer state sharded, ZeRO-3; MaxText's ``embed: fsdp``); sequence axes split
    ``seq``; tensor-parallel axes split ``heads``, ``kv_heads``, ``q_per_kv``, ``d_ff`` and ``vocab``
    (Megatron-LM) and, where a tensor has none of them, ``seq`` (sequence parallelism, Korthikanti et
    al. 2022); expert axes split ``experts``. ``stage_axis`` and axes of unknown names split nothing.
    Rules whose split would not divide the dim are left out. ``notes`` (when given) gets one line per axis of
    unknown name and per rule left out."""
    role = {}
    for axis in mesh.names:
        for r, names in AXIS_ROLES.items():
            if axis.lower() in names and axis != stage_axis:
                role[axis] = r
    by_role = {r: [a for a in mesh.names if role.get(a) == r] for r in AXIS_ROLES}
    rules: list[tuple[str, tuple[str, ...]]] = []
    said = [] if notes is None else notes
    for axis in mesh.names:
        if axis not in role and axis != stage_axis and mesh.axis_size(axis) > 1:
            said.append(f"mesh axis {axis!r} has no conventional role, so the default layout splits nothing over "
                        f"it (conventional names: {', '.join(sorted({n for ns in AXIS_ROLES.values() for n in ns}))}"
                        "); give --layout to use it")

    left: list[tuple[str, tuple[str, ...]]] = []

    def rule(dim: str, axes: list[str]) -> None:
        if axes and dim in graph.dims:
            (rules if graph.dims[dim] % mesh.group_size(axes) == 0 else left).append((dim, tuple(axes)))

    rule("batch", by_role["data"] + by_role["fsdp"])
    rule("seq", by_role["seq"])
    for dim in CONVENTIONAL_DIMS["model"]:
        rule(dim, by_role["model"])
    rule("experts", by_role["expert"])
    rule("d_model", by_role["fsdp"])
    if not by_role["seq"]:
        rule("seq", by_role["model"])
    for dim, axes in left:  # (unless every tensor with the dim has another dim split over those axes)
        if any(all(a not in xs for d, xs in rules if d in t.dim_names) for a in axes
               for t in graph.tensors.values() if dim in t.dim_names):
            said.append(f"the default layout leaves out {dim}:{'+'.join(axes)}: {dim}={graph.dims[dim]} is not "
                        f"divisible by {mesh.group_size(axes)}")
    return format_rules(rules)


def _axes(a: Any) -> Axes:
    if a is None:
        return ()
    if isinstance(a, str):
        return tuple(x for x in a.split("+") if x)
    return tuple(a)
