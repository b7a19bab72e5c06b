"""Exports of a layout to the formats JAX programs consume.

* :func:`partition_specs`: every tensor's PartitionSpec entries (plain tuples,
  no JAX needed), per-tensor entries included;
* :func:`flax_logical_axis_rules`: the global rules as Flax
  ``logical_axis_rules`` ((dim, mesh axes) pairs, used with
  ``nn.logical_axis_rules`` / ``nn.logical_to_mesh_axes``);
* :func:`maxtext_overrides`: the same rules as a MaxText config fragment
  (lists only, ready for ``yaml.safe_dump``);
* :func:`python_snippet`: paste-able Python that builds the mesh, one
  ``jax.sharding.PartitionSpec`` per tensor and the Flax rules.

Rule precedence is the same in layoutsearch and in Flax (rules in order; a
rule applies to a tensor when its dim is still unassigned and none of its
mesh axes is used yet), with one difference the exports correct: Flax lets a
rule with no axes (``d_model:-``) claim the dim and so shadow the dim's later
rules, whereas in layoutsearch such a rule is a no-op. An empty rule that is
followed by a non-empty rule for the same dim is therefore left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from layoutsearch.errors import LayoutError
from layoutsearch.ir.graph import Graph
from layoutsearch.layout import Axes, Layout, SpecEntry

MAXTEXT_MESH_AXES = ("data", "stage", "fsdp", "fsdp_transpose", "sequence", "context", "context_autoregressive",
                     "tensor", "tensor_transpose", "tensor_sequence", "expert", "autoregressive")
"""Mesh axis names MaxText knows; only these get an ``ici_<axis>_parallelism`` entry."""


def partition_specs(layout: Layout, graph: Graph) -> dict[str, tuple[SpecEntry, ...]]:
    """Tensor name -> PartitionSpec entries (None, an axis, or a tuple of axes per dim).

    Checks the layout against ``graph`` first (LayoutError if it does not fit)."""
    layout.check(graph)
    return {t.name: layout.spec(t) for t in graph.tensors.values()}


def _rules(layout: Layout) -> tuple[tuple[str, Axes], ...]:
    """The layout's rules, which apply exactly as Flax applies logical axis rules."""
    if layout.tensors:
        names = ", ".join(repr(n) for n, _ in layout.tensors)
        raise LayoutError(f"layout has per-tensor entries ({names}), which logical axis rules cannot express; "
                          "export it with partition_specs or python_snippet instead")
    return layout.rules


def _entry(axes: Axes) -> str | tuple[str, ...] | None:
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def flax_logical_axis_rules(layout: Layout) -> list[tuple[str, str | tuple[str, ...] | None]]:
    """The global rules as Flax ``logical_axis_rules``: ``[("batch", "data"), ("embed", ("data", "fsdp")), ...]``.

    Logical axis names are the graph's dim names. Raises LayoutError for a
    layout with per-tensor entries (rules cannot express them)."""
    return [(dim, _entry(axes)) for dim, axes in _rules(layout)]


def maxtext_overrides(layout: Layout, dim_names: Mapping[str, str | Sequence[str]] | None = None) -> dict[str, Any]:
    """A MaxText config fragment: ``mesh_axes``, ``logical_axis_rules`` and ``ici_<axis>_parallelism``.

    ``logical_axis_rules`` is a list of ``[logical_name, [mesh axes]]`` (an
    empty list: unsplit), as in MaxText's ``base.yml``. ``dim_names`` renames
    the graph's dims to MaxText logical axis names (a dim may become several,
    e.g. ``{"batch": ["activation_batch"], "d_ff": ["mlp", "activation_mlp"]}``);
    dims not in it keep their name. Mesh axes named like MaxText's (see
    :data:`MAXTEXT_MESH_AXES`) also get their size as ``ici_<axis>_parallelism``;
    MaxText itself only accepts its own mesh axis names."""
    rules: list[list[Any]] = []
    for dim, axes in _rules(layout):
        names = (dim_names or {}).get(dim, dim)
        for name in [names] if isinstance(names, str) else names:
            rules.append([name, list(axes)])
    out: dict[str, Any] = {"mesh_axes": list(layout.mesh.names), "logical_axis_rules": rules}
    for axis, size in layout.mesh.axes:
        if axis in MAXTEXT_MESH_AXES:
            out[f"ici_{axis}_parallelism"] = size
    return out


def _spec_source(spec: tuple[SpecEntry, ...]) -> str:
    parts = []
    for s in spec:
        if s is None:
            parts.append("None")
        elif isinstance(s, str):
            parts.append(repr(s))
        else:
            parts.append("(" + ", ".join(repr(a) for a in s) + ")")
    return "P(" + ", ".join(parts) + ")"


def python_snippet(layout: Layout, graph: Graph) -> str:
    """Paste-able Python: the mesh, ``partition_specs`` (one ``PartitionSpec`` per tensor),
    ``shardings`` (``NamedSharding`` per tensor) and, for a rules-only layout, ``logical_axis_rules``."""
    specs = partition_specs(layout, graph)
    mesh = layout.mesh
    rules = layout.describe() or "replicated"
    lines = [
        f"# layoutsearch: model {graph.name!r} on mesh {mesh} (rules: {rules})",
        "import jax",
        "from jax.sharding import NamedSharding",
        "from jax.sharding import PartitionSpec as P",
        "",
        f"mesh = jax.make_mesh({tuple(s for _, s in mesh.axes)!r}, {tuple(mesh.names)!r})",
        "partition_specs = {",
        *(f"    {name!r}: {_spec_source(spec)}," for name, spec in specs.items()),
        "}",
        "shardings = {name: NamedSharding(mesh, spec) for name, spec in partition_specs.items()}",
    ]
    if not layout.tensors:
        lines.append(f"logical_axis_rules = {flax_logical_axis_rules(layout)!r}  # Flax nn.logical_axis_rules")
    return "\n".join(lines) + "\n"
